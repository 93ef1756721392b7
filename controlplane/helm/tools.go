//go:build tools

// Package helm pins the Helm CLI (helm.sh/helm/v3/cmd/helm) that the e2e tests and docs/install.md run against
// the local cluster; ascend_cluster.build builds it beside the control plane.
package helm

import _ "helm.sh/helm/v3/cmd/helm"
