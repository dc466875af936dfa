package idemgrpc

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/idemkit/idem"
)

// keyOf returns the call's key, from the KeyField of its request or its
// metadata, and whether it has one. A malformed key is INVALID_ARGUMENT;
// a KeyField that names a field that is not a string is INTERNAL.
func (i *Interceptor) keyOf(ctx context.Context, method string, req any) (key string, present bool, err error) {
	vs := metadata.ValueFromIncomingContext(ctx, MetadataKey)
	if len(vs) > 1 {
		return "", false, i.invalidKey(fmt.Sprintf("the call carries %d %s metadata values; send one", len(vs), MetadataKey))
	}
	if len(vs) == 1 {
		key, present = vs[0], true
	}
	if i.cfg.KeyField != "" {
		field, ok, err := fieldKey(req, i.cfg.KeyField)
		if err != nil {
			return "", false, i.fail(ctx, "key", method, key, err)
		}
		if ok {
			if present && key != field {
				return "", false, i.invalidKey(fmt.Sprintf("the request's %s field (%q) and the %s metadata (%q) differ; send one key, or the same in both", i.cfg.KeyField, field, MetadataKey, key))
			}
			key, present = field, true
		}
	}
	if present {
		if err := idem.ValidateKey(key); err != nil {
			return key, true, i.invalidKey(err.Error())
		}
	}
	return key, present, nil
}

// keyField returns the descriptor of the string field name of req, nil
// when req is not a message or has no such field, or an error when the
// field is not a singular string.
func keyField(req any, name string) (protoreflect.Message, protoreflect.FieldDescriptor, error) {
	m, ok := req.(proto.Message)
	if !ok || m == nil {
		return nil, nil, nil
	}
	pm := m.ProtoReflect()
	fd := pm.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		return nil, nil, nil
	}
	if fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
		return nil, nil, fmt.Errorf("idemgrpc: the key field %s of %s is not a singular string field", name, pm.Descriptor().FullName())
	}
	return pm, fd, nil
}

// fieldKey returns the value of req's key field, and whether it is set.
func fieldKey(req any, name string) (string, bool, error) {
	pm, fd, err := keyField(req, name)
	if pm == nil || err != nil {
		return "", false, err
	}
	v := pm.Get(fd).String()
	return v, v != "", nil
}

// sideEffectFree caches, per full method name, whether the method's
// descriptor declares idempotency_level = NO_SIDE_EFFECTS.
var sideEffectFree sync.Map

// declaredNoSideEffects reports whether the method's descriptor, found
// in protoregistry.GlobalFiles (where generated code registers it),
// declares option idempotency_level = NO_SIDE_EFFECTS. A method without a
// registered descriptor (a hand-written grpc.ServiceDesc) declares
// nothing.
func declaredNoSideEffects(method string) bool {
	if v, ok := sideEffectFree.Load(method); ok {
		return v.(bool)
	}
	free := false
	name := protoreflect.FullName(strings.Replace(strings.TrimPrefix(method, "/"), "/", ".", 1))
	if d, err := protoregistry.GlobalFiles.FindDescriptorByName(name); err == nil {
		if md, ok := d.(protoreflect.MethodDescriptor); ok {
			opts, _ := md.Options().(*descriptorpb.MethodOptions)
			free = opts.GetIdempotencyLevel() == descriptorpb.MethodOptions_NO_SIDE_EFFECTS
		}
	}
	sideEffectFree.Store(method, free)
	return free
}

// retried reports whether the call is an attempt that grpc-go's retry
// policy sends again (it numbers them in grpc-previous-rpc-attempts): one
// most likely served already, here or at another instance, whose key's
// record Do and Begin then read before they claim the key
// ([idem.WithRetryHint]). It is a hint: a wrong one costs a read and
// changes no answer.
func retried(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get("grpc-previous-rpc-attempts")
	if len(v) != 1 {
		return false
	}
	n, err := strconv.Atoi(v[0])
	return err == nil && n > 0
}
