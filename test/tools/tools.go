//go:build tools

// Package tools pins the Kubernetes and etcd components that the tests and the
// local cluster build from source (no prebuilt binary can be downloaded here).
package tools

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
