package procs

import (
	"maps"
	"testing"

	"google.golang.org/protobuf/proto"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The hand-written encoding against k8s.io/cri-api's generated messages:
// the request decodes as a ContainerStatusRequest, and the labels come out
// of a full ContainerStatusResponse (every neighbouring field set, the
// annotations map beside the labels) as the generated decoder reads them.
func TestCRIWireMatchesTheGeneratedMessages(t *testing.T) {
	var req criv1.ContainerStatusRequest
	if err := proto.Unmarshal(containerStatusRequest("3f2a"), &req); err != nil || req.ContainerId != "3f2a" || req.Verbose {
		t.Fatalf("request decodes as %+v (%v), want container_id 3f2a", &req, err)
	}
	labels := map[string]string{"io.kubernetes.pod.name": "chat-api-0", "io.kubernetes.pod.namespace": "inference",
		"io.kubernetes.container.name": "server", "empty": ""}
	resp := &criv1.ContainerStatusResponse{
		Status: &criv1.ContainerStatus{Id: "3f2a", Metadata: &criv1.ContainerMetadata{Name: "server", Attempt: 2},
			State: criv1.ContainerState_CONTAINER_RUNNING, CreatedAt: 1, StartedAt: 2, ExitCode: 0,
			Image: &criv1.ImageSpec{Image: "nvcr.io/x"}, ImageRef: "sha256:1", Reason: "r", Message: "m",
			Labels: labels, Annotations: map[string]string{"io.kubernetes.pod.name": "not-a-label"},
			Mounts: []*criv1.Mount{{ContainerPath: "/a", HostPath: "/b"}}, LogPath: "/var/log/x"},
		Info: map[string]string{"info": "{}"},
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	got, err := containerLabels(b)
	if err != nil || !maps.Equal(got, labels) {
		t.Errorf("labels %v (%v), want %v", got, err, labels)
	}
	if _, err := containerLabels(b[:len(b)-3]); err == nil {
		t.Error("a truncated answer decodes without error")
	}
}
