package rightsize

import (
	"fmt"
	"io"
	"sort"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// podChange is what a person would change in a workload's pod template
// to follow a recommendation: the GPU resource its containers ask for and
// the nodeSelector that puts it on the pool serving the new shape. The
// command prints it (-o yaml); it never applies it.
type podChange struct {
	containers   []string
	oldResource  string
	newResource  string // "" to release the GPUs
	count        int
	nodeSelector map[string]string
}

// changeFor is the change of a row's recommendation, nil where nothing
// changes (keep) or the data carry no recommendation.
func (o *Observation) changeFor(wh *workloadHoldings, current Shape, c Choice) *podChange {
	if c.Recommendation == RecommendKeep || c.Recommendation == InsufficientData {
		return nil
	}
	seen := map[string]bool{}
	ch := &podChange{}
	for _, h := range wh.current {
		if !seen[h.Container] {
			seen[h.Container] = true
			ch.containers = append(ch.containers, h.Container)
		}
		if ch.oldResource == "" {
			ch.oldResource = h.Resource
		}
	}
	sort.Strings(ch.containers)
	if ch.oldResource == "" {
		ch.oldResource = "nvidia.com/gpu"
	}
	if c.Recommendation == RecommendRelease {
		return ch
	}
	ch.count = c.Devices
	shape := current
	if c.Shape != nil {
		shape = *c.Shape
	}
	var pool *nodePool
	if !shape.NewPool {
		pool = servingPool(o.pools(), shape)
		if pool == nil {
			pool = o.poolOf(wh.current[0].Node)
		}
	}
	ch.newResource = o.resourceFor(shape, pool)
	ch.nodeSelector = o.selectorFor(shape, pool)
	return ch
}

// podTemplatePath is where a kind holds its pod spec, and its API
// version; kinds not listed get the pod spec alone.
var podTemplatePath = map[string]struct {
	apiVersion string
	path       []string
}{
	"Deployment":  {"apps/v1", []string{"spec", "template", "spec"}},
	"StatefulSet": {"apps/v1", []string{"spec", "template", "spec"}},
	"ReplicaSet":  {"apps/v1", []string{"spec", "template", "spec"}},
	"DaemonSet":   {"apps/v1", []string{"spec", "template", "spec"}},
	"Job":         {"batch/v1", []string{"spec", "template", "spec"}},
	"CronJob":     {"batch/v1", []string{"spec", "jobTemplate", "spec", "template", "spec"}},
	"Pod":         {"v1", []string{"spec"}},
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }

func nullNode() *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"} }

func mapping(kv ...any) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for i := 0; i+1 < len(kv); i += 2 {
		v, ok := kv[i+1].(*yaml.Node)
		if !ok {
			v = scalar(fmt.Sprint(kv[i+1]))
		}
		n.Content = append(n.Content, scalar(kv[i].(string)), v)
	}
	return n
}

// writeYAML prints, per workload whose recommendation changes something,
// the change as a strategic merge patch of its pod template (kubectl patch
// --type=strategic), with a comment that says what it does.
func (rs *Recommendations) writeYAML(w io.Writer) error {
	n := 0
	for _, r := range rs.Workloads {
		if r.change == nil {
			continue
		}
		n++
		ch := r.change
		limits := mapping()
		if ch.newResource != ch.oldResource {
			limits.Content = append(limits.Content, scalar(ch.oldResource), nullNode())
		}
		if ch.newResource != "" {
			limits.Content = append(limits.Content, scalar(ch.newResource), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(ch.count)})
		}
		containers := &yaml.Node{Kind: yaml.SequenceNode}
		for _, c := range ch.containers {
			containers.Content = append(containers.Content, mapping("name", c, "resources", mapping("limits", limits)))
		}
		podSpec := mapping()
		if len(ch.nodeSelector) > 0 {
			keys := make([]string, 0, len(ch.nodeSelector))
			for k := range ch.nodeSelector {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			sel := mapping()
			for _, k := range keys {
				sel.Content = append(sel.Content, scalar(k), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: ch.nodeSelector[k]})
			}
			podSpec.Content = append(podSpec.Content, scalar("nodeSelector"), sel)
		}
		podSpec.Content = append(podSpec.Content, scalar("containers"), containers)

		where, known := podTemplatePath[r.Kind]
		doc := mapping()
		comment := fmt.Sprintf("%s/%s: %s", r.Namespace, r.Workload, r.recommendation())
		if r.Pool != "" {
			comment += "; pool: " + r.Pool
		}
		if r.MonthlySaving != nil {
			comment += fmt.Sprintf("; saves %.2f $/month", *r.MonthlySaving)
		}
		comment += "\nnot applied: review, then kubectl patch " + r.Kind + " " + r.Name + " -n " + r.Namespace + " --type=strategic --patch-file=<this document>"
		switch {
		case r.Kind == "Pod":
			comment += "\na Pod's resources and nodeSelector cannot change in place: recreate it with this"
		case r.Kind == "Job":
			comment += "\na Job's pod template cannot change once created: change what creates it"
		case !known:
			comment = fmt.Sprintf("%s/%s: %s; put this pod spec into the pod template(s) of the %s", r.Namespace, r.Workload, r.recommendation(), r.Kind)
			where.path = []string{"podTemplateSpec", "spec"}
		}
		doc.HeadComment = comment
		if known {
			doc.Content = append(doc.Content, scalar("apiVersion"), scalar(where.apiVersion))
		}
		doc.Content = append(doc.Content, scalar("kind"), scalar(r.Kind),
			scalar("metadata"), mapping("name", r.Name, "namespace", r.Namespace))
		inner := podSpec
		for i := len(where.path) - 1; i >= 0; i-- {
			inner = mapping(where.path[i], inner)
		}
		doc.Content = append(doc.Content, inner.Content...)
		if _, err := io.WriteString(w, "---\n"); err != nil {
			return err
		}
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(doc); err != nil {
			return err
		}
		if err := enc.Close(); err != nil {
			return err
		}
	}
	if n == 0 {
		_, err := io.WriteString(w, "# no recommendation changes a workload\n")
		return err
	}
	return nil
}
