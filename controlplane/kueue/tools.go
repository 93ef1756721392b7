//go:build tools

package kueue

import _ "sigs.k8s.io/kueue/cmd/kueue"
