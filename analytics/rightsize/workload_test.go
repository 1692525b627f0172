package rightsize

import "testing"

func TestResolveOwners(t *testing.T) {
	o := NewOwners()
	o.AddPod("web", "chat-7c9d-abcde", "ReplicaSet", "chat-7c9d")
	o.AddReplicaSet("web", "chat-7c9d", "Deployment", "chat")
	o.AddPod("web", "orphan-rs-x", "ReplicaSet", "orphan-rs")
	o.AddReplicaSet("web", "orphan-rs", noOwner, noOwner)
	o.AddPod("ml", "train-workers-0-0-xyz", "Job", "train-workers-0")
	o.AddJob("ml", "train-workers-0", "JobSet", "train")
	o.AddPod("ml", "nightly-29000-abc", "Job", "nightly-29000")
	o.AddJob("ml", "nightly-29000", "CronJob", "nightly")
	o.AddPod("ml", "once-abc", "Job", "once")
	o.AddPod("ml", "db-0", "StatefulSet", "db")
	o.AddPod("ml", "lws-0", "StatefulSet", "lws")
	o.AddPodLabel("ml", "lws-0", "label_leaderworkerset_sigs_k8s_io_name", "llama")
	o.AddPod("ml", "lws-0-1", "Pod", "lws-0")
	o.AddPodLabel("ml", "lws-0-1", "label_leaderworkerset_sigs_k8s_io_name", "llama")
	o.AddPod("ml", "js-labelled", "Job", "unknown-job")
	o.AddPodLabel("ml", "js-labelled", "label_jobset_sigs_k8s_io_jobset_name", "sweep")
	o.AddPod("research", "notebook", noOwner, noOwner)
	for _, tc := range []struct{ ns, pod, want string }{
		{"web", "chat-7c9d-abcde", "Deployment/chat"},
		{"web", "orphan-rs-x", "ReplicaSet/orphan-rs"},
		{"ml", "train-workers-0-0-xyz", "JobSet/train"},
		{"ml", "nightly-29000-abc", "CronJob/nightly"},
		{"ml", "once-abc", "Job/once"},
		{"ml", "db-0", "StatefulSet/db"},
		{"ml", "lws-0", "LeaderWorkerSet/llama"},
		{"ml", "lws-0-1", "LeaderWorkerSet/llama"},
		{"ml", "js-labelled", "JobSet/sweep"},
		{"research", "notebook", "Pod/notebook"},
		{"research", "never-seen", "Pod/never-seen"},
	} {
		if got := o.Resolve(tc.ns, tc.pod).String(); got != tc.want {
			t.Errorf("Resolve(%s/%s) = %s, want %s", tc.ns, tc.pod, got, tc.want)
		}
	}
}

func TestKSMLabelName(t *testing.T) {
	for in, want := range map[string]string{
		"team":                             "label_team",
		"app.kubernetes.io/part-of":        "label_app_kubernetes_io_part_of",
		"leaderworkerset.sigs.k8s.io/name": "label_leaderworkerset_sigs_k8s_io_name",
	} {
		if got := KSMLabelName(in); got != want {
			t.Errorf("KSMLabelName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseBy(t *testing.T) {
	for in, want := range map[string]By{
		"namespace":                       {Kind: ByNamespace},
		"owner":                           {Kind: ByOwner},
		"label:team":                      {Kind: ByLabel, Label: "team"},
		"label:app.kubernetes.io/part-of": {Kind: ByLabel, Label: "app.kubernetes.io/part-of"},
	} {
		if got, err := ParseBy(in); err != nil || got != want {
			t.Errorf("ParseBy(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "team", "label:", "Namespace", "pod"} {
		if _, err := ParseBy(bad); err == nil {
			t.Errorf("ParseBy(%q) accepted", bad)
		}
	}
}
