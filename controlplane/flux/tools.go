//go:build tools

// Package flux pins Flux's source-controller and kustomize-controller (the GitOps loop of docs/gitops.md);
// ascend_cluster.build builds both beside the control plane.
package flux

import (
	_ "github.com/fluxcd/kustomize-controller"
	_ "github.com/fluxcd/source-controller"
)
