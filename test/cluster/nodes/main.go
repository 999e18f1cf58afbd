// Command nodes creates simulated GPU nodes for the local kwok cluster: NFD
// labels for several OS releases and kernels, nvidia.com/gpu capacity, one node
// with a pre-installed driver and one node without a GPU. kwok makes them
// Ready and runs the pods scheduled on them.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// osRelease is an OS an NFD-labelled node reports.
type osRelease struct{ id, version string }

func main() {
	var (
		kubeconfig = flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the local cluster")
		count      = flag.Int("gpu-nodes", 6, "number of GPU nodes")
		prefix     = flag.String("prefix", "gpu-node", "node name prefix")
		osList     = flag.String("os", "ubuntu20.04,ubuntu22.04", "OS releases to spread GPU nodes over (ID+VERSION_ID)")
		kernels    = flag.String("kernels", "5.15.0-84-generic,5.15.0-78-generic", "kernels to spread GPU nodes over")
		extras     = flag.Bool("extras", true, "also create a pre-installed-driver node and a non-GPU node")
		parallel   = flag.Int("parallel", 16, "concurrent creates")
		first      = flag.Int("start", 0, "index of the first GPU node (to add nodes in batches)")
		groupLabel = flag.String("group-label", "", "if set, label GPU node i <group-label>=<i mod groups> (for benchmarks selecting subsets)")
		groups     = flag.Int("groups", 1, "number of groups for --group-label")
	)
	flag.Parse()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	cfg.QPS, cfg.Burst = 200, 400
	cs := kubernetes.NewForConfigOrDie(cfg)

	var oses []osRelease
	for _, s := range strings.Split(*osList, ",") {
		id := strings.TrimRight(s, "0123456789.")
		oses = append(oses, osRelease{id: id, version: strings.TrimPrefix(s, id)})
	}
	kern := strings.Split(*kernels, ",")

	var nodes []*corev1.Node
	for i := *first; i < *first+*count; i++ {
		o := oses[i%len(oses)]
		k := kern[(i/len(oses))%len(kern)]
		var extra map[string]string
		if *groupLabel != "" {
			extra = map[string]string{*groupLabel: fmt.Sprint(i % max(*groups, 1))}
		}
		nodes = append(nodes, gpuNode(fmt.Sprintf("%s-%d", *prefix, i), o, k, extra))
	}
	if *extras {
		nodes = append(nodes, gpuNode(*prefix+"-preinstalled", oses[0], kern[0], map[string]string{"nvidia.com/gpu.deploy.driver": "pre-installed"}))
		cpu := gpuNode("cpu-node-0", oses[0], kern[0], nil)
		delete(cpu.Labels, "feature.node.kubernetes.io/pci-10de.present")
		delete(cpu.Status.Capacity, "nvidia.com/gpu")
		delete(cpu.Status.Allocatable, "nvidia.com/gpu")
		nodes = append(nodes, cpu)
	}

	start := time.Now()
	sem := make(chan struct{}, *parallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for _, n := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func(n *corev1.Node) {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := cs.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("%s: %v", n.Name, err))
				mu.Unlock()
			}
		}(n)
	}
	wg.Wait()
	if len(errs) > 0 {
		fmt.Fprintln(os.Stderr, "error: creating nodes:\n  "+strings.Join(errs, "\n  "))
		os.Exit(1)
	}
	fmt.Printf("created %d node(s) in %s\n", len(nodes), time.Since(start).Round(time.Millisecond))
}

func gpuNode(name string, o osRelease, kernel string, extra map[string]string) *corev1.Node {
	major := strings.Split(o.version, ".")[0]
	labels := map[string]string{
		"type":                   "kwok",
		"kubernetes.io/hostname": name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		"feature.node.kubernetes.io/pci-10de.present":                   "true",
		"feature.node.kubernetes.io/system-os_release.ID":               o.id,
		"feature.node.kubernetes.io/system-os_release.VERSION_ID":       o.version,
		"feature.node.kubernetes.io/system-os_release.VERSION_ID.major": major,
		"feature.node.kubernetes.io/kernel-version.full":                kernel,
	}
	for k, v := range extra {
		labels[k] = v
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
		"nvidia.com/gpu":      resource.MustParse("8"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      labels,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
		},
		Status: corev1.NodeStatus{
			Capacity:    res,
			Allocatable: res.DeepCopy(),
			NodeInfo:    corev1.NodeSystemInfo{KernelVersion: kernel, OSImage: o.id + " " + o.version, Architecture: "amd64", OperatingSystem: "linux", KubeletVersion: "fake"},
			Phase:       corev1.NodeRunning,
		},
	}
}
