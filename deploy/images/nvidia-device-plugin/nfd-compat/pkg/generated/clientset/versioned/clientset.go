// Package versioned is a typed client for NodeFeature objects with the
// interface of NFD v0.15's generated clientset, as far as GFD uses it (get,
// create, update, delete in a namespace), over client-go's REST client.
package versioned

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"

	"sigs.k8s.io/node-feature-discovery/pkg/apis/nfd/v1alpha1"
)

const resource = "nodefeatures"

var (
	scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
}

// Interface is the clientset: one API group, nfd.k8s-sigs.io/v1alpha1.
type Interface interface {
	NfdV1alpha1() NfdV1alpha1Interface
}

// NfdV1alpha1Interface reaches the group's NodeFeature objects.
type NfdV1alpha1Interface interface {
	NodeFeatures(namespace string) NodeFeatureInterface
}

// NodeFeatureInterface reads and writes NodeFeature objects in one namespace.
type NodeFeatureInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1alpha1.NodeFeature, error)
	Create(ctx context.Context, nf *v1alpha1.NodeFeature, opts metav1.CreateOptions) (*v1alpha1.NodeFeature, error)
	Update(ctx context.Context, nf *v1alpha1.NodeFeature, opts metav1.UpdateOptions) (*v1alpha1.NodeFeature, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// Clientset talks to the API server through one REST client.
type Clientset struct {
	client rest.Interface
}

var _ Interface = (*Clientset)(nil)

// NewForConfig makes a clientset from a client configuration (its QPS and
// burst apply).
func NewForConfig(c *rest.Config) (*Clientset, error) {
	config := *c
	gv := v1alpha1.SchemeGroupVersion
	config.GroupVersion = &gv
	config.APIPath = "/apis"
	config.NegotiatedSerializer = codecs.WithoutConversion()
	if config.UserAgent == "" {
		config.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	client, err := rest.RESTClientFor(&config)
	if err != nil {
		return nil, err
	}
	return &Clientset{client: client}, nil
}

// NfdV1alpha1 returns the nfd.k8s-sigs.io/v1alpha1 client.
func (c *Clientset) NfdV1alpha1() NfdV1alpha1Interface { return c }

// NodeFeatures returns the client for NodeFeature objects in namespace.
func (c *Clientset) NodeFeatures(namespace string) NodeFeatureInterface {
	return nodeFeatures{client: c.client, namespace: namespace}
}

type nodeFeatures struct {
	client    rest.Interface
	namespace string
}

func (n nodeFeatures) Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1alpha1.NodeFeature, error) {
	result := &v1alpha1.NodeFeature{}
	err := n.client.Get().Namespace(n.namespace).Resource(resource).Name(name).
		VersionedParams(&opts, parameterCodec).Do(ctx).Into(result)
	return result, err
}

func (n nodeFeatures) Create(ctx context.Context, nf *v1alpha1.NodeFeature, opts metav1.CreateOptions) (*v1alpha1.NodeFeature, error) {
	result := &v1alpha1.NodeFeature{}
	err := n.client.Post().Namespace(n.namespace).Resource(resource).
		VersionedParams(&opts, parameterCodec).Body(nf).Do(ctx).Into(result)
	return result, err
}

func (n nodeFeatures) Update(ctx context.Context, nf *v1alpha1.NodeFeature, opts metav1.UpdateOptions) (*v1alpha1.NodeFeature, error) {
	result := &v1alpha1.NodeFeature{}
	err := n.client.Put().Namespace(n.namespace).Resource(resource).Name(nf.Name).
		VersionedParams(&opts, parameterCodec).Body(nf).Do(ctx).Into(result)
	return result, err
}

func (n nodeFeatures) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return n.client.Delete().Namespace(n.namespace).Resource(resource).Name(name).
		Body(&opts).Do(ctx).Error()
}
