package kubeapi

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v2"
)

// Config says where the API server is and who the client is.
type Config struct {
	// Host is the API server's URL (https://10.0.0.1:443).
	Host string
	// CA verifies the server's certificate; nil: the system's roots.
	CA *x509.CertPool
	// Insecure skips verifying the server's certificate (a kubeconfig's
	// insecure-skip-tls-verify).
	Insecure bool
	// ServerName overrides the name the certificate is checked against.
	ServerName string
	// ClientCert authenticates the client by certificate.
	ClientCert *tls.Certificate
	// Token is a bearer token; TokenFile one read again as it rotates
	// (a service account's projected token is replaced every hour).
	Token     string
	TokenFile string
	// Username and Password are basic auth (rare; static clusters).
	Username, Password string
	// UserAgent names the client in the API server's logs and audit.
	UserAgent string
}

// The in-cluster service account, as the kubelet mounts it.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	inClusterToken    = serviceAccountDir + "/token"
	inClusterCA       = serviceAccountDir + "/ca.crt"
)

// ErrNotInCluster says the process runs outside a pod with a service
// account.
var ErrNotInCluster = errors.New("not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set)")

// InCluster is the configuration of a pod's service account: the API
// server from KUBERNETES_SERVICE_HOST/PORT, its token and CA from the
// mounted service account.
func InCluster() (*Config, error) {
	return inCluster(serviceAccountDir)
}

func inCluster(dir string) (*Config, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, ErrNotInCluster
	}
	tokenFile := filepath.Join(dir, "token")
	if _, err := os.Stat(tokenFile); err != nil {
		return nil, fmt.Errorf("the pod's service account token: %w (is automountServiceAccountToken off?)", err)
	}
	pem, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("the pod's service account CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", filepath.Join(dir, "ca.crt"))
	}
	return &Config{Host: "https://" + net.JoinHostPort(host, port), CA: pool, TokenFile: tokenFile}, nil
}

// kubeconfig is the part of a kubeconfig file this client reads.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server                   string `yaml:"server"`
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
			TLSServerName            string `yaml:"tls-server-name"`
			ProxyURL                 string `yaml:"proxy-url"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			ClientCertificate     string `yaml:"client-certificate"`
			ClientCertificateData string `yaml:"client-certificate-data"`
			ClientKey             string `yaml:"client-key"`
			ClientKeyData         string `yaml:"client-key-data"`
			Token                 string `yaml:"token"`
			TokenFile             string `yaml:"tokenFile"`
			Username              string `yaml:"username"`
			Password              string `yaml:"password"`
			Exec                  any    `yaml:"exec"`
			AuthProvider          any    `yaml:"auth-provider"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
}

// maxKubeconfigBytes bounds the file: certificates and a few contexts fit.
const maxKubeconfigBytes = 4 << 20

// LoadKubeconfig reads the current context of the kubeconfig at path as
// kubectl does: file paths in it are relative to the file's folder, data
// fields are base64. Authentication by exec plugin or auth provider is
// refused with what to use instead: the exporter carries no plugins.
func LoadKubeconfig(path string) (*Config, error) {
	if strings.Contains(path, string(os.PathListSeparator)) {
		return nil, fmt.Errorf("%q names several files: give one kubeconfig", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxKubeconfigBytes {
		return nil, fmt.Errorf("%s is %d bytes, over the limit of %d: is it a kubeconfig?", path, fi.Size(), maxKubeconfigBytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(abs)
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	if kc.CurrentContext == "" {
		return nil, fmt.Errorf("%s has no current-context: set one (kubectl config use-context NAME --kubeconfig=%s)", path, path)
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: current-context %q is not among its contexts", path, kc.CurrentContext)
	}
	cfg := &Config{}
	found = false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		cl := c.Cluster
		if cl.Server == "" {
			return nil, fmt.Errorf("%s: cluster %q has no server", path, clusterName)
		}
		if u, err := url.Parse(cl.Server); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("%s: cluster %q: server %q is not an http(s) URL", path, clusterName, cl.Server)
		}
		if cl.ProxyURL != "" {
			return nil, fmt.Errorf("%s: cluster %q sets proxy-url, which this client does not support: reach the API server directly", path, clusterName)
		}
		cfg.Host, cfg.Insecure, cfg.ServerName = cl.Server, cl.InsecureSkipTLSVerify, cl.TLSServerName
		pem, err := fileOrData(rel(cl.CertificateAuthority), cl.CertificateAuthorityData)
		if err != nil {
			return nil, fmt.Errorf("%s: cluster %q: certificate authority: %w", path, clusterName, err)
		}
		if pem != nil {
			cfg.CA = x509.NewCertPool()
			if !cfg.CA.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s: cluster %q: the certificate authority holds no PEM certificate", path, clusterName)
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: context %q names cluster %q, which it does not define", path, kc.CurrentContext, clusterName)
	}
	found = false
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		found = true
		us := u.User
		if us.Exec != nil || us.AuthProvider != nil {
			return nil, fmt.Errorf("%s: user %q authenticates through an exec plugin or auth provider, which the exporter does not run: give it a token (token, tokenFile) or a client certificate", path, userName)
		}
		cfg.Token, cfg.TokenFile, cfg.Username, cfg.Password = us.Token, rel(us.TokenFile), us.Username, us.Password
		cert, err := fileOrData(rel(us.ClientCertificate), us.ClientCertificateData)
		if err != nil {
			return nil, fmt.Errorf("%s: user %q: client certificate: %w", path, userName, err)
		}
		key, err := fileOrData(rel(us.ClientKey), us.ClientKeyData)
		if err != nil {
			return nil, fmt.Errorf("%s: user %q: client key: %w", path, userName, err)
		}
		if (cert == nil) != (key == nil) {
			return nil, fmt.Errorf("%s: user %q has a client certificate or key without the other", path, userName)
		}
		if cert != nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("%s: user %q: %w", path, userName, err)
			}
			cfg.ClientCert = &pair
		}
	}
	if !found && userName != "" {
		return nil, fmt.Errorf("%s: context %q names user %q, which it does not define", path, kc.CurrentContext, userName)
	}
	return cfg, nil
}

// fileOrData reads file, else decodes base64 data; nil when neither is set.
func fileOrData(file, data string) ([]byte, error) {
	if data != "" {
		b, err := base64.StdEncoding.DecodeString(data)
		if err != nil {
			return nil, fmt.Errorf("the -data field is not base64: %w", err)
		}
		return b, nil
	}
	if file == "" {
		return nil, nil
	}
	return os.ReadFile(file)
}
