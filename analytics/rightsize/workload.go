package rightsize

import "strings"

// Workload is what a pod belongs to: its controller as a person names it
// (a Deployment rather than the ReplicaSet of its current rollout, the
// JobSet rather than one of its Jobs), or the pod itself when it has none.
type Workload struct {
	Namespace string `json:"namespace"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
}

// String is Kind/Name.
func (w Workload) String() string { return w.Kind + "/" + w.Name }

// PodKey names a pod.
type PodKey struct{ Namespace, Pod string }

// ownerRef is a controller reference as kube-state-metrics reports it.
type ownerRef struct{ Kind, Name string }

// noOwner is kube-state-metrics' owner_kind and owner_name for an object
// without an owner.
const noOwner = "<none>"

// Pod labels that name a workload the owner chain does not reach: a
// LeaderWorkerSet's pods belong to StatefulSets (the workers' owned by the
// leader pod), and JobSet labels its pods as well as owning their Jobs.
// kube-state-metrics serves them only when allowed
// (--metric-labels-allowlist=pods=[...]).
const (
	lwsNameLabel    = "leaderworkerset.sigs.k8s.io/name"
	jobSetNameLabel = "jobset.sigs.k8s.io/jobset-name"
)

// Owners is the part of kube-state-metrics' object graph that resolves a
// pod to its workload: kube_pod_owner, kube_replicaset_owner,
// kube_job_owner and kube_pod_labels.
type Owners struct {
	Pods        map[PodKey]ownerRef
	ReplicaSets map[PodKey]ownerRef          // keyed by namespace and ReplicaSet name
	Jobs        map[PodKey]ownerRef          // keyed by namespace and Job name
	PodLabels   map[PodKey]map[string]string // by kube-state-metrics' label name
}

// NewOwners returns an empty graph.
func NewOwners() *Owners {
	return &Owners{
		Pods:        map[PodKey]ownerRef{},
		ReplicaSets: map[PodKey]ownerRef{},
		Jobs:        map[PodKey]ownerRef{},
		PodLabels:   map[PodKey]map[string]string{},
	}
}

// AddPod records a pod's controller (kube_pod_owner); kind "<none>" or ""
// means it has none.
func (o *Owners) AddPod(namespace, pod, kind, name string) {
	o.Pods[PodKey{namespace, pod}] = ownerRef{kind, name}
}

// AddReplicaSet records a ReplicaSet's owner (kube_replicaset_owner).
func (o *Owners) AddReplicaSet(namespace, rs, kind, name string) {
	o.ReplicaSets[PodKey{namespace, rs}] = ownerRef{kind, name}
}

// AddJob records a Job's owner (kube_job_owner).
func (o *Owners) AddJob(namespace, job, kind, name string) {
	o.Jobs[PodKey{namespace, job}] = ownerRef{kind, name}
}

// AddPodLabel records one of a pod's labels as kube_pod_labels serves it
// (label_app_kubernetes_io_name: see KSMLabelName).
func (o *Owners) AddPodLabel(namespace, pod, label, value string) {
	k := PodKey{namespace, pod}
	if o.PodLabels[k] == nil {
		o.PodLabels[k] = map[string]string{}
	}
	o.PodLabels[k][label] = value
}

func isOwner(r ownerRef) bool {
	return r.Kind != "" && r.Kind != noOwner && r.Name != "" && r.Name != noOwner
}

// Resolve returns a pod's workload: a LeaderWorkerSet or JobSet its labels
// name; else its controller, followed from a ReplicaSet to the object that
// owns it (a Deployment) and from a Job to the object that owns it (a
// JobSet, a CronJob); else the pod itself.
func (o *Owners) Resolve(namespace, pod string) Workload {
	k := PodKey{namespace, pod}
	if l := o.PodLabels[k]; l != nil {
		if n := l[KSMLabelName(lwsNameLabel)]; n != "" {
			return Workload{namespace, "LeaderWorkerSet", n}
		}
		if n := l[KSMLabelName(jobSetNameLabel)]; n != "" {
			return Workload{namespace, "JobSet", n}
		}
	}
	own, ok := o.Pods[k]
	if !ok || !isOwner(own) {
		return Workload{namespace, "Pod", pod}
	}
	switch own.Kind {
	case "ReplicaSet":
		if up := o.ReplicaSets[PodKey{namespace, own.Name}]; isOwner(up) {
			return Workload{namespace, up.Kind, up.Name}
		}
	case "Job":
		if up := o.Jobs[PodKey{namespace, own.Name}]; isOwner(up) {
			return Workload{namespace, up.Kind, up.Name}
		}
	}
	return Workload{namespace, own.Kind, own.Name}
}

// KSMLabelName is the label under which kube-state-metrics serves a
// Kubernetes label in kube_pod_labels and kube_node_labels: "label_" and
// the name with every character other than a letter, digit or underscore
// turned into an underscore.
func KSMLabelName(k8sLabel string) string {
	var b strings.Builder
	b.WriteString("label_")
	for _, r := range k8sLabel {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
