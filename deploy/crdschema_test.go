package deploy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// gmpCRDDir holds Google Cloud Managed Service for Prometheus' CRDs as GMP
// publishes them (see its SOURCE.md). GMP's Go types cannot be used here: they
// import packages that exist only in Google's fork of Prometheus.
const gmpCRDDir = "testdata/gmp-crds"

// crdSchema checks objects of one CRD version the way the API server does
// with strict field validation: fields the schema does not know (pruning),
// then the schema's types, formats, enums and patterns, then its
// x-kubernetes-validations CEL rules.
type crdSchema struct {
	structural *structuralschema.Structural
	validator  validation.SchemaValidator
	cel        *cel.Validator
}

var (
	gmpSchemasOnce sync.Once
	gmpSchemas     map[string]*crdSchema // by "apiVersion Kind"
	gmpSchemasErr  error
)

// gmpSchema returns the published schema of a GMP kind, or nil for another group.
func gmpSchema(t *testing.T, apiVersion, kind string) *crdSchema {
	t.Helper()
	gmpSchemasOnce.Do(func() { gmpSchemas, gmpSchemasErr = loadCRDs(gmpCRDDir) })
	if gmpSchemasErr != nil {
		t.Fatal(gmpSchemasErr)
	}
	return gmpSchemas[apiVersion+" "+kind]
}

func loadCRDs(dir string) (map[string]*crdSchema, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no CRDs in %s: %v", dir, err)
	}
	out := map[string]*crdSchema{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := strictUnmarshal(b, &crd); err != nil {
			return nil, fmt.Errorf("%s: %v", f, err)
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
				continue
			}
			var internal apiextensions.JSONSchemaProps
			if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
				return nil, fmt.Errorf("%s %s: %v", f, v.Name, err)
			}
			s := &crdSchema{}
			if s.structural, err = structuralschema.NewStructural(&internal); err != nil {
				return nil, fmt.Errorf("%s %s: not a structural schema: %v", f, v.Name, err)
			}
			if s.validator, _, err = validation.NewSchemaValidator(&internal); err != nil {
				return nil, fmt.Errorf("%s %s: %v", f, v.Name, err)
			}
			s.cel = cel.NewValidator(s.structural, true, celconfig.PerCallLimit)
			out[crd.Spec.Group+"/"+v.Name+" "+crd.Spec.Names.Kind] = s
		}
	}
	return out, nil
}

// validate returns every way doc breaks the schema.
func (s *crdSchema) validate(doc []byte) field.ErrorList {
	// Decoded as the API server decodes: integers as int64, not float64.
	j, err := yaml.YAMLToJSON(doc)
	var obj map[string]any
	if err == nil {
		err = utiljson.Unmarshal(j, &obj)
	}
	if err != nil {
		return field.ErrorList{field.Invalid(nil, string(doc), err.Error())}
	}
	// The API server's order: prune (strict field validation reports what
	// pruning removes), default, validate.
	var errs field.ErrorList
	for _, p := range pruning.PruneWithOptions(obj, s.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}) {
		errs = append(errs, field.Invalid(field.NewPath(p), nil, "unknown field (strict decoding error)"))
	}
	defaulting.Default(obj, s.structural)
	errs = append(errs, validation.ValidateCustomResource(nil, obj, s.validator)...)
	if s.cel != nil {
		celErrs, _ := s.cel.Validate(context.Background(), nil, s.structural, obj, nil, celconfig.RuntimeCELCostBudget)
		errs = append(errs, celErrs...)
	}
	return errs
}

// TestGMPCRDsAsPublished: the vendored CRDs are byte for byte the ones
// SOURCE.md names, so a check against them is a check against GMP.
func TestGMPCRDsAsPublished(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(gmpCRDDir, "SOURCE.md"))
	if err != nil {
		t.Fatal(err)
	}
	sums := regexp.MustCompile("(?m)^- `([^`]+)`: sha256 `([0-9a-f]{64})`").FindAllStringSubmatch(string(src), -1)
	files, _ := filepath.Glob(filepath.Join(gmpCRDDir, "*.yaml"))
	if len(sums) != len(files) || len(files) == 0 {
		t.Fatalf("SOURCE.md lists %d files with their sha256, %s holds %d", len(sums), gmpCRDDir, len(files))
	}
	for _, s := range sums {
		b, err := os.ReadFile(filepath.Join(gmpCRDDir, s[1]))
		if err != nil {
			t.Error(err)
			continue
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != s[2] {
			t.Errorf("%s: sha256 %s, SOURCE.md says %s: edited after it was copied from GMP?", s[1], got, s[2])
		}
	}
	for _, kind := range []string{"PodMonitoring", "ClusterRules"} {
		if gmpSchema(t, "monitoring.googleapis.com/v1", kind) == nil {
			t.Errorf("no schema for monitoring.googleapis.com/v1 %s", kind)
		}
	}
}

// TestGMPSchemaCatchesMistakes: the schema check fails what GKE's API server
// would refuse, so that a pass means something.
func TestGMPSchemaCatchesMistakes(t *testing.T) {
	pm := gmpSchema(t, "monitoring.googleapis.com/v1", "PodMonitoring")
	cr := gmpSchema(t, "monitoring.googleapis.com/v1", "ClusterRules")
	const podMonitoring = `apiVersion: monitoring.googleapis.com/v1
kind: PodMonitoring
metadata: {name: gpu-pool-exporter, namespace: gpu-pool-exporter}
spec:
  selector: {matchLabels: {app: x}}
  endpoints:
    - port: metrics
      interval: 30s
`
	if errs := pm.validate([]byte(podMonitoring)); len(errs) != 0 {
		t.Fatalf("a valid PodMonitoring fails: %v", errs)
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown field", strings.Replace(podMonitoring, "interval: 30s", "interval: 30s\n      honorLabels: true", 1), "honorLabels"},
		{"wrong type", strings.Replace(podMonitoring, "interval: 30s", "interval: 30s\n      scheme: 1", 1), "scheme"},
		{"enum", strings.Replace(podMonitoring, "interval: 30s", "interval: 30s\n      scheme: ftp", 1), "scheme"},
		{"CEL rule", strings.Replace(podMonitoring, "interval: 30s", "interval: 10s\n      timeout: 20s", 1), "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := pm.validate([]byte(tc.doc))
			if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.want) {
				t.Errorf("%s: errors %v, want one about %s", tc.name, errs, tc.want)
			}
		})
	}
	const rules = `apiVersion: monitoring.googleapis.com/v1
kind: ClusterRules
metadata: {name: r}
spec:
  groups:
    - name: g
      rules:
        - alert: A
          expr: up == 0
          keep_firing_for: 5m
`
	if errs := cr.validate([]byte(rules)); len(errs) == 0 {
		t.Errorf("ClusterRules with keep_firing_for (GMP has no such field) passes")
	}
}

// TestOperatorTypesDecideStrictness: ServiceMonitor, PodMonitor and
// PrometheusRule decode strictly into prometheus-operator's own types, so
// what the operator accepts passes and a misspelt field fails.
func TestOperatorTypesDecideStrictness(t *testing.T) {
	const sm = `apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec:
  selector: {matchLabels: {app: x}}
  endpoints:
    - port: metrics
      FIELD: true
`
	var out monitoringv1.ServiceMonitor
	// followRedirects is the operator's (HTTPConfig); a local copy of the
	// schema that lacked it refused it.
	if err := strictUnmarshal([]byte(strings.Replace(sm, "FIELD", "followRedirects", 1)), &out); err != nil {
		t.Errorf("a field of prometheus-operator's Endpoint fails: %v", err)
	}
	if err := strictUnmarshal([]byte(strings.Replace(sm, "FIELD", "honorLabel", 1)), &out); err == nil {
		t.Errorf("a misspelt field (honorLabel) decodes")
	}
	const rule = `apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: x}
spec:
  groups:
    - name: g
      rules:
        - alert: A
          expr: up == 0
          FIELD: 5m
`
	// The operator's Rule spells it as a rules file does, keep_firing_for;
	// the local copy of its schema said keepFiringFor.
	var pr monitoringv1.PrometheusRule
	if err := strictUnmarshal([]byte(strings.Replace(rule, "FIELD", "keep_firing_for", 1)), &pr); err != nil {
		t.Errorf("keep_firing_for fails: %v", err)
	}
	if err := strictUnmarshal([]byte(strings.Replace(rule, "FIELD", "keepFiringFor", 1)), &pr); err == nil {
		t.Errorf("keepFiringFor, a field the operator does not have, decodes")
	}
	// GMP takes a port number as well as a name.
	const pmg = `apiVersion: monitoring.googleapis.com/v1
kind: PodMonitoring
metadata: {name: x}
spec:
  selector: {matchLabels: {app: x}}
  endpoints: [{port: 9947, interval: 30s}]
`
	if errs := gmpSchema(t, "monitoring.googleapis.com/v1", "PodMonitoring").validate([]byte(pmg)); len(errs) > 0 {
		t.Errorf("a PodMonitoring with a port number fails GMP's schema: %v", errs)
	}
}
