// Package v1alpha1 is the NodeFeature API (nfd.k8s-sigs.io/v1alpha1) at the
// import path NFD v0.15 had, as aliases of the published
// sigs.k8s.io/node-feature-discovery/api/nfd/v1alpha1: what GFD's
// --use-node-feature-api output needs.
package v1alpha1

import nfd "sigs.k8s.io/node-feature-discovery/api/nfd/v1alpha1"

type (
	NodeFeature     = nfd.NodeFeature
	NodeFeatureList = nfd.NodeFeatureList
	NodeFeatureSpec = nfd.NodeFeatureSpec
	Features        = nfd.Features
)

const NodeFeatureObjNodeNameLabel = nfd.NodeFeatureObjNodeNameLabel

var (
	SchemeGroupVersion = nfd.SchemeGroupVersion
	AddToScheme        = nfd.AddToScheme
)

// NewFeatures returns an empty set of features.
func NewFeatures() *Features { return nfd.NewFeatures() }
