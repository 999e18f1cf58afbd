package integration

import (
	appsv1 "k8s.io/api/apps/v1"
)

func names(m map[string][]appsv1.DaemonSet) map[string][]string {
	out := map[string][]string{}
	for k, v := range m {
		for _, ds := range v {
			out[k] = append(out[k], ds.Name)
		}
	}
	return out
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
