package procs

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// The one CRI call the resolver makes, RuntimeService.ContainerStatus, in
// the CRI's protobuf wire format (k8s.io/cri-api's api.proto, runtime.v1),
// encoded here rather than through the generated package: that package
// registers the whole CRI API's descriptors when the binary starts, about
// 200 KB of heap and 0.7 MiB of resident memory in every node agent, for
// two fields of two messages. The tests serve the call with the generated
// package's own server.
const containerStatusMethod = "/runtime.v1.RuntimeService/ContainerStatus"

// Field numbers of the messages read and written (api.proto).
const (
	fieldRequestContainerID = 1  // ContainerStatusRequest.container_id
	fieldResponseStatus     = 1  // ContainerStatusResponse.status
	fieldStatusLabels       = 12 // ContainerStatus.labels (map<string,string>)
	fieldMapKey             = 1
	fieldMapValue           = 2
)

// containerStatusRequest is ContainerStatusRequest{container_id: id}.
func containerStatusRequest(id string) []byte {
	b := protowire.AppendTag(nil, fieldRequestContainerID, protowire.BytesType)
	return protowire.AppendString(b, id)
}

// containerLabels reads ContainerStatusResponse.status.labels.
func containerLabels(resp []byte) (map[string]string, error) {
	labels := map[string]string{}
	err := eachField(resp, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != fieldResponseStatus || typ != protowire.BytesType {
			return nil
		}
		return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
			if num != fieldStatusLabels || typ != protowire.BytesType {
				return nil
			}
			var key, value string
			if err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
				if typ != protowire.BytesType {
					return nil
				}
				switch num {
				case fieldMapKey:
					key = string(v)
				case fieldMapValue:
					value = string(v)
				}
				return nil
			}); err != nil {
				return err
			}
			labels[key] = value
			return nil
		})
	})
	return labels, err
}

// eachField calls fn with every field of the message b; the value of a
// length-delimited field is its bytes, of the others nil.
func eachField(b []byte, fn func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("CRI answer: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("CRI answer: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// rawCodec passes messages already in the wire format through gRPC; it is
// named "proto", the content subtype runtimes serve.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: marshal %T, want []byte", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return errors.New("rawCodec: unmarshal needs a *[]byte")
	}
	*p = data.Materialize()
	return nil
}
