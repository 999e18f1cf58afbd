// Command run is `make bench`: it brings up the local simulated cluster with N
// GPU nodes (4 OS releases × 6 kernels) and 20 NVIDIADriver CRs, runs the
// controller and the plugin against it, and measures what issue #7 asks for,
// each against its baseline in the same run. Results go to stdout (a
// markdown table) and, as JSON, to --out.
//
// It is a benchmark, not a test: it asserts nothing but fails loudly when a
// phase does not finish within its deadline.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

const (
	groupLabel = "bench.group"
	groups     = 25 // 0-9 label CRs, 10-14 precompiled, 15-18 feature CRs, 19-24 the default
	namespace  = "gpu-operator"
)

var (
	root       string
	nodesN     = flag.Int("nodes", 1000, "simulated GPU nodes")
	runs       = flag.Int("runs", 5, "repetitions of each timed measurement (medians are reported)")
	idle       = flag.Duration("idle", 5*time.Minute, "idle window (measured as 5 equal slices)")
	moves      = flag.Int("moves", 100, "node moves for the move latency")
	rollP      = flag.Int("rollout-parallel", 100, "maxParallelUpgrades of the rollout")
	rollAll    = flag.Int("rollout-all-max", 1000, "up to this many nodes the rollout covers every node (the other CRs are deleted first, their nodes moving to the default); above it, it rolls the default CR's nodes as they are (a quarter of them): kube-controller-manager recreating thousands of driver pods twice would dominate the run")
	out        = flag.String("out", "", "write the results as JSON here")
	keep       = flag.Bool("keep", false, "leave the cluster and controller running")
	batch      = flag.Int("batch", 500, "nodes created per batch (each batch waits for kwok to make them Ready)")
	cluster    = flag.String("cluster", "nvdriver-bench", "local cluster name")
	kcmQPS     = flag.Int("kcm-qps", 0, "kube-controller-manager's --kube-api-qps (burst twice that); 0: 20 per 1,000 nodes, kube-controller-manager's own default (20, burst 30) up to 1,000 (docs/design.md, \"Simulated cluster at scale\")")
	nodeStatus = flag.Duration("node-status-every", 5*time.Minute, "how often each simulated node posts its status: 5m is a kubelet with node leases (its nodeStatusReportFrequency); 20s is kwok's stage without leases, which earlier runs used")
	maxProcs   = flag.Int("controller-gomaxprocs", chartGOMAXPROCS, "GOMAXPROCS for the controller: the Helm chart's (its CPU limit in whole cores, rounded up) by default; 0 is Go's default, the machine's cores outside a container")
	phases     = flag.String("phases", "converge,fleet", "which parts to run: converge (one CR, nodes added while the controller runs) and fleet (20 CRs: first start, plugin, cold starts, idle, moves, rollout)")
)

// results is what the run measured, in the units the names say.
type results struct {
	Nodes   int    `json:"nodes"`
	CRs     int    `json:"crs"`
	Machine string `json:"machine"`
	// NodeStatusEvery is the simulated nodes' status cadence: every node
	// event the controller receives at rest is one of these.
	NodeStatusEvery string `json:"nodeStatusEvery"`
	// ControllerGOMAXPROCS is --controller-gomaxprocs (0: Go's default;
	// runs before session 36 ran Go's default, 2 on this machine).
	ControllerGOMAXPROCS int                `json:"controllerGOMAXPROCS"`
	Values               map[string]float64 `json:"values"`
	Notes                []string           `json:"notes"`
}

var res = results{Values: map[string]float64{}}

func main() {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	wd, _ := os.Getwd()
	root = wd
	res.Nodes = *nodesN
	res.Machine = machine()
	res.NodeStatusEvery = nodeStatus.String()
	res.ControllerGOMAXPROCS = *maxProcs
	if err := bench(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s >> %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

func machine() string {
	cpu := "?"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "model name") {
				cpu = strings.TrimSpace(strings.SplitN(sc.Text(), ":", 2)[1])
				break
			}
		}
		f.Close()
	}
	return fmt.Sprintf("%d cores (%s)", numCPU(), cpu)
}

func numCPU() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

func sh(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return string(b), fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
	return string(b), nil
}

type env struct {
	kubeconfig string
	cfg        *rest.Config
	c          client.Client
	nodes      *nodeWatch
	ctrl       *controllerProc
	crs        []string
	reg        *registrytest.Registry
}

func bench() error {
	clusterEnv := []string{"NVDRIVER_CLUSTER_NAME=" + *cluster}
	if _, err := sh(nil, "make", "-s", "build"); err != nil {
		return err
	}
	// Heartbeat factor 10: kube-controller-manager's node-monitor-grace-period
	// becomes 400 s, so lagging kwok heartbeats on a busy apiserver do not
	// flap nodes NotReady and disturb the measurements.
	up := []string{"up", "--gpu-nodes", "0", "--heartbeat-factor", "10", "--node-status-every", nodeStatus.String()}
	qps := *kcmQPS
	if qps == 0 {
		qps = 20 * *nodesN / 1000
	}
	if qps > 20 || *kcmQPS != 0 {
		up = append(up, "--controller-manager-qps", fmt.Sprint(qps))
	} else {
		qps = 20
	}
	logf("cluster %s up (kwokctl --heartbeat-factor 10, node status every %v, kube-controller-manager at %d requests/s)", *cluster, *nodeStatus, qps)
	if _, err := sh(clusterEnv, "test/cluster/cluster.sh", up...); err != nil {
		return err
	}
	kc, _ := sh(clusterEnv, "test/cluster/cluster.sh", "kubeconfig")
	e := &env{kubeconfig: strings.TrimSpace(kc)}
	if !*keep {
		defer func() {
			if e.ctrl != nil {
				e.ctrl.stop()
			}
			_, _ = sh(clusterEnv, "test/cluster/cluster.sh", "down")
		}()
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 200, 400
	e.cfg = cfg
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	if e.c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}

	if err := e.startRegistry(); err != nil {
		return err
	}
	defer e.reg.Close()
	if _, err := sh([]string{"KUBECONFIG=" + e.kubeconfig}, "kubectl", "apply", "--server-side", "-f", "charts/nvdriver/crds/"); err != nil {
		return err
	}
	if _, err := sh([]string{"KUBECONFIG=" + e.kubeconfig}, "kubectl", "create", "namespace", namespace); err != nil {
		return err
	}
	if _, err := sh([]string{"KUBECONFIG=" + e.kubeconfig}, "kubectl", "wait", "--for=condition=Established", "crd/nvidiadrivers.nvidia.com"); err != nil {
		return err
	}
	if strings.Contains(*phases, "converge") {
		if err := e.converge(); err != nil {
			return err
		}
	}
	if strings.Contains(*phases, "fleet") {
		if err := e.createNodes(); err != nil {
			return err
		}
		if e.nodes, err = watchNodes(cfg); err != nil {
			return err
		}
		// The phases in order; each measures against its baseline and fails the
		// run loudly when it does not finish within its deadline.
		for _, phase := range []func() error{e.applyCRs, e.firstStart, e.plugin, e.coldStarts, e.idle, e.moveLatency, e.rollout} {
			if err := phase(); err != nil {
				return err
			}
		}
	}
	e.report()
	return nil
}

// applyCRs creates the 20 CRs: 10 by label, 5 precompiled, 4 with features
// (RDMA, GDS, custom labels/tolerations, vGPU), 1 default. Budgets are
// unlimited so the moves of the later phases do not queue.
func (e *env) applyCRs() error {
	policy := func() *v1alpha1.DriverUpgradePolicySpec {
		mu := intstr.FromString("100%")
		return &v1alpha1.DriverUpgradePolicySpec{AutoUpgrade: true, MaxParallelUpgrades: 0, MaxUnavailable: &mu}
	}
	var list []*v1alpha1.NVIDIADriver
	mk := func(name string, group int, mut func(*v1alpha1.NVIDIADriverSpec)) {
		d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: name}}
		d.Spec.Version = "535.104.12"
		if group >= 0 {
			d.Spec.NodeSelector = map[string]string{groupLabel: fmt.Sprint(group)}
		}
		d.Spec.UpgradePolicy = policy()
		if mut != nil {
			mut(&d.Spec)
		}
		list = append(list, d)
	}
	for i := range 10 {
		mk(fmt.Sprintf("label-%d", i), i, func(s *v1alpha1.NVIDIADriverSpec) {
			s.Version = []string{"535.104.12", "550.90.07", "525.125.06"}[i%3]
		})
	}
	for i := range 5 {
		mk(fmt.Sprintf("precompiled-%d", i), 10+i, func(s *v1alpha1.NVIDIADriverSpec) {
			s.UsePrecompiled = ptr(true)
			s.Version = []string{"535", "550"}[i%2]
		})
	}
	mk("rdma", 15, func(s *v1alpha1.NVIDIADriverSpec) {
		s.GPUDirectRDMA = &v1alpha1.GPUDirectRDMASpec{Enabled: ptr(true)}
	})
	mk("gds", 16, func(s *v1alpha1.NVIDIADriverSpec) {
		s.GPUDirectStorage = &v1alpha1.GPUDirectStorageSpec{Enabled: ptr(true), Repository: "nvcr.io/nvidia/cloud-native", Image: "nvidia-fs", Version: "2.20.5"}
	})
	mk("custom", 17, func(s *v1alpha1.NVIDIADriverSpec) {
		s.Labels = map[string]string{"team": "ml"}
		s.Annotations = map[string]string{"example.com/owner": "ml"}
		s.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	})
	mk("vgpu", 18, func(s *v1alpha1.NVIDIADriverSpec) {
		s.DriverType = v1alpha1.VGPU
		s.Image = "vgpu-guest-driver"
	})
	mk("default", -1, func(s *v1alpha1.NVIDIADriverSpec) { s.Default = true; s.Version = "550.90.07" })
	for _, d := range list {
		d.Spec.Repository = e.reg.Host + "/nvidia"
		if g := d.Spec.GPUDirectStorage; g != nil {
			g.Repository = e.reg.Host + "/nvidia/cloud-native"
		}
	}
	if err := e.pushImages(list); err != nil {
		return err
	}
	for _, d := range list {
		if err := e.c.Create(context.Background(), d); err != nil {
			return fmt.Errorf("creating NVIDIADriver %s: %w", d.Name, err)
		}
		e.crs = append(e.crs, d.Name)
	}
	res.CRs = len(list)
	return nil
}

// firstStart: the controller on a cluster it has never seen (it labels every
// GPU node), to every CR reconciled and every node owned; then to all ready.
func (e *env) firstStart() error {
	var err error
	t0 := time.Now()
	if e.ctrl, err = startController(e.kubeconfig, "first"); err != nil {
		return err
	}
	if err := poll(30*time.Minute, "first start: every CR reconciled and every GPU node owned", func() (bool, error) {
		return e.ctrl.reconciledAll(e.crs) && e.nodes.owned() >= *nodesN, nil
	}); err != nil {
		return err
	}
	res.Values["first_start_seconds"] = time.Since(t0).Seconds()
	logf("first start: %.1f s", res.Values["first_start_seconds"])
	if err := e.waitAllReady(30 * time.Minute); err != nil {
		return err
	}
	res.Values["first_start_all_ready_seconds"] = time.Since(t0).Seconds()
	logf("all CRs ready (driver pods created by kube-controller-manager, made Ready by kwok): %.1f s", res.Values["first_start_all_ready_seconds"])
	e.ctrl.quiet(10 * time.Second)
	m := e.ctrl.scrape()
	res.Values["controller_rss_mib"] = e.ctrl.rssMiB()
	res.Values["controller_peak_rss_mib"] = e.ctrl.peakRSSMiB()
	res.Values["controller_heap_inuse_mib"] = m.sum("go_memstats_heap_inuse_bytes", nil) / (1 << 20)
	res.Values["controller_heap_alloc_mib"] = m.sum("go_memstats_heap_alloc_bytes", nil) / (1 << 20)
	res.Values["controller_rss_file_mib"] = e.ctrl.procStatus("RssFile")
	res.Values["controller_go_sys_mib"] = m.sum("go_memstats_sys_bytes", nil) / (1 << 20)
	res.Values["registry_checks_first_start"] = m.sum("nvdriver_registry_checks_total", nil)
	logf("registry checks during the first start: %.0f (%.0f images pushed)", res.Values["registry_checks_first_start"], res.Values["registry_images"])
	res.Values["controller_resting"] = m.sum("nvdriver_memory_resting", nil)
	logf("controller after convergence: RSS %.0f MiB (peak %.0f; of it %.0f MiB file-backed: the binary's pages), heap in use %.0f MiB, Go runtime's memory %.0f MiB, resting %.0f",
		res.Values["controller_rss_mib"], res.Values["controller_peak_rss_mib"], res.Values["controller_rss_file_mib"], res.Values["controller_heap_inuse_mib"], res.Values["controller_go_sys_mib"], res.Values["controller_resting"])
	e.ctrl.heapProfile(fmt.Sprintf("bench-results/heap-%d.pprof", *nodesN))
	return nil
}

// cpuProfile saves a CPU profile of the controller over d and logs its top.
func (p *controllerProc) cpuProfile(path string, d time.Duration) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", p.pprof, int(d.Seconds())))
	if err != nil {
		logf("cpu profile: %v", err)
		return
	}
	defer resp.Body.Close()
	_ = os.MkdirAll(filepath.Join(root, filepath.Dir(path)), 0o755)
	f, err := os.Create(filepath.Join(root, path))
	if err != nil {
		return
	}
	_, _ = f.ReadFrom(resp.Body)
	f.Close()
	top, _ := exec.Command("go", "tool", "pprof", "-top", "-nodecount", "15", filepath.Join(root, path)).CombinedOutput()
	logf("CPU profile saved to %s:\n%s", path, top)
}

// heapProfile saves the controller's heap profile (after a GC) and logs its
// top entries: the evidence behind the memory figure.
func (p *controllerProc) heapProfile(path string) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1", p.pprof))
	if err != nil {
		logf("heap profile: %v", err)
		return
	}
	defer resp.Body.Close()
	_ = os.MkdirAll(filepath.Join(root, filepath.Dir(path)), 0o755)
	f, err := os.Create(filepath.Join(root, path))
	if err != nil {
		return
	}
	_, _ = f.ReadFrom(resp.Body)
	f.Close()
	top, _ := exec.Command("go", "tool", "pprof", "-top", "-inuse_space", "-nodecount", "12", filepath.Join(root, path)).CombinedOutput()
	logf("heap profile saved to %s:\n%s", path, top)
	m := p.scrape()
	res.Values["controller_live_heap_mib"] = m.sum("go_memstats_heap_alloc_bytes", nil) / (1 << 20)
}

func (e *env) waitAllReady(d time.Duration) error {
	lastAvail, since := -1, time.Now()
	return poll(d, "every NVIDIADriver ready, with a driver pod available on each of its pools' nodes", func() (bool, error) {
		list := &v1alpha1.NVIDIADriverList{}
		if err := e.c.List(context.Background(), list); err != nil {
			return false, err
		}
		// Ready is the DaemonSets' word (desired == updated == available),
		// and at thousands of nodes kube-controller-manager's DaemonSet
		// controller counts a pool's nodes into desired minutes after they
		// were labelled: every CR was ready with 2,900 of 5,000 driver pods
		// made, and the idle window that followed measured the cluster
		// still converging. So the pools' own node counts must be reached.
		avail, nodes := 0, 0
		ready := len(list.Items) > 0
		for _, d := range list.Items {
			if d.Status.State != v1alpha1.Ready || d.Status.ObservedGeneration != d.Generation {
				ready = false
			}
			for _, p := range d.Status.Pools {
				avail += int(min(p.Available, p.Nodes))
				nodes += int(p.Nodes)
			}
		}
		if avail != lastAvail {
			lastAvail, since = avail, time.Now()
		} else if avail < nodes && time.Since(since) > time.Minute {
			e.repairKwokReadiness()
			since = time.Now()
		}
		return ready && avail >= nodes, nil
	})
}

// coldStarts restarts the converged controller and times each restart to
// every CR reconciled by the new process.
func (e *env) coldStarts() error {
	var times []float64
	for i := range *runs {
		e.ctrl.stop()
		var err error
		t0 := time.Now()
		if e.ctrl, err = startController(e.kubeconfig, fmt.Sprintf("cold%d", i)); err != nil {
			return err
		}
		if err := poll(2*time.Minute, "cold start: every CR reconciled", func() (bool, error) {
			return e.ctrl.reconciledAll(e.crs), nil
		}); err != nil {
			return err
		}
		times = append(times, time.Since(t0).Seconds())
	}
	res.Values["cold_start_seconds"] = median(times)
	res.Values["cold_start_max_seconds"] = maxOf(times)
	logf("cold start: median %.2f s (runs %v)", median(times), rounded(times, 2))
	return nil
}

// idle: the converged cluster left alone; writes, requests, CPU and log
// volume of the controller, in five equal slices. The CPU is the whole
// window's, not a slice's median: the window is one period of the nodes'
// status posts, and nodes created in batches post in waves, so some slices
// hold most of the posts and the median slice held few of them (session 42).
func (e *env) idle() error {
	e.ctrl.quiet(10 * time.Second)
	slice := *idle / 5
	var writes, leaseWrites, reqs, cpu, logBytes []float64
	var cpuSeconds, elapsed float64
	var first, last metricsText
	for range 5 {
		m0, c0, l0, t0 := e.ctrl.scrape(), e.ctrl.cpuSeconds(), e.ctrl.logSize(), time.Now()
		if first == nil {
			first = m0
		}
		time.Sleep(slice) // the measurement window itself, not a synchronisation
		m1, c1, l1, el := e.ctrl.scrape(), e.ctrl.cpuSeconds(), e.ctrl.logSize(), time.Since(t0).Seconds()
		last = m1
		w := m1.sum("nvdriver_api_writes_total", nil) - m0.sum("nvdriver_api_writes_total", nil)
		lw := m1.sum("nvdriver_api_writes_total", map[string]string{"resource": "leases"}) - m0.sum("nvdriver_api_writes_total", map[string]string{"resource": "leases"})
		writes = append(writes, w-lw)
		leaseWrites = append(leaseWrites, lw)
		reqs = append(reqs, (m1.sum("rest_client_requests_total", nil)-m0.sum("rest_client_requests_total", nil))/el)
		cpu = append(cpu, (c1-c0)/el)
		cpuSeconds += c1 - c0
		elapsed += el
		logBytes = append(logBytes, float64(l1-l0)/el*3600)
	}
	res.Values["idle_writes"] = sum(writes)
	res.Values["idle_lease_writes"] = sum(leaseWrites)
	res.Values["idle_requests_per_second"] = median(reqs)
	res.Values["idle_cores"] = cpuSeconds / elapsed
	res.Values["idle_cores_median_slice"] = median(cpu)
	res.Values["idle_log_bytes_per_hour"] = median(logBytes)
	logf("idle %s: %v writes (+%v Lease renewals), %.2f requests/s, %.4f cores (slices %v), %.0f log bytes/hour",
		*idle, sum(writes), sum(leaseWrites), median(reqs), cpuSeconds/elapsed, rounded(cpu, 4), median(logBytes))
	// At rest the controller's CPU is what it receives: the nodes' status
	// heartbeats, each dropped before the reconcilers. Their rate and the
	// CPU per heartbeat say whether the cluster sent more or the
	// controller spent more on each.
	beats := last.sum("nvdriver_node_heartbeats_total", nil) - first.sum("nvdriver_node_heartbeats_total", nil)
	res.Values["idle_heartbeats_per_second"] = beats / elapsed
	if beats > 0 {
		res.Values["idle_cpu_ms_per_heartbeat"] = cpuSeconds / beats * 1000
	}
	logf("idle: %.1f node heartbeats/s received, %.2f ms of controller CPU per heartbeat (all of the window's CPU over them)",
		res.Values["idle_heartbeats_per_second"], res.Values["idle_cpu_ms_per_heartbeat"])
	if sum(writes) > 0 {
		// What the controller wrote, and what woke it: the cluster (a
		// DaemonSet's status, a node's) or its own writes coming back.
		logf("idle: writes %v; passes woken by controller and source %v", countsBetween(first, last, "nvdriver_api_writes_total", "verb", "resource"),
			countsBetween(first, last, "nvdriver_wakeups_total", "controller", "source"))
	}
	// The controller here is the last cold start's, converged and idle
	// for the whole window.
	m := e.ctrl.scrape()
	res.Values["idle_rss_mib"] = e.ctrl.rssMiB()
	res.Values["idle_heap_inuse_mib"] = m.sum("go_memstats_heap_inuse_bytes", nil) / (1 << 20)
	res.Values["idle_resting"] = m.sum("nvdriver_memory_resting", nil)
	logf("controller after the idle window: RSS %.0f MiB, heap in use %.0f MiB, resting %.0f (%.0f rests since it started)",
		res.Values["idle_rss_mib"], res.Values["idle_heap_inuse_mib"], res.Values["idle_resting"], m.sum("nvdriver_memory_rests_total", nil))
	e.ctrl.cpuProfile(fmt.Sprintf("bench-results/idle-cpu-%d.pprof", *nodesN), 20*time.Second)
	return nil
}

// moveLatency relabels nodes from label-2p to label-2p+1 one at a time and times
// each to the node entering its move state (move-to annotation set, or the
// owner label changed where no driver pod ran).
func (e *env) moveLatency() error {
	m0, c0 := e.ctrl.scrape(), e.ctrl.cpuSeconds()
	profiled := make(chan struct{})
	go func() {
		e.ctrl.cpuProfile(fmt.Sprintf("bench-results/moves-cpu-%d.pprof", *nodesN), 15*time.Second)
		close(profiled)
	}()
	defer func() { <-profiled }()
	var lat, own []float64
	// Group 2p's nodes move to group 2p+1 (label-2p -> label-2p+1), p = 0..4.
	type move struct{ node, group, to string }
	var plan5 []move
	for k := 0; len(plan5) < *moves && k*groups < *nodesN; k++ {
		for p := 0; p < 5 && len(plan5) < *moves; p++ {
			if i := k*groups + 2*p; i < *nodesN {
				plan5 = append(plan5, move{fmt.Sprintf("bench-node-%d", i), fmt.Sprint(2*p + 1), fmt.Sprintf("label-%d", 2*p+1)})
			}
		}
	}
	for _, mv := range plan5 {
		name, to := mv.node, mv.to
		patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, groupLabel, mv.group))
		ch := e.nodes.waitFor(name, func(m *metav1.PartialObjectMetadata) bool {
			return m.Annotations[upgrade.AnnotationMoveTo] == to || m.Labels[plan.LabelOwner] == to
		})
		t0 := time.Now()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := e.c.Patch(context.Background(), n, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return err
		}
		own = append(own, time.Since(t0).Seconds())
		select {
		case at := <-ch:
			lat = append(lat, at.Sub(t0).Seconds())
		case <-time.After(30 * time.Second):
			return fmt.Errorf("node %s did not enter its move state within 30s", name)
		}
	}
	sort.Float64s(lat)
	res.Values["move_latency_p50_ms"] = percentile(lat, 50) * 1000
	res.Values["move_latency_p99_ms"] = percentile(lat, 99) * 1000
	res.Values["moves"] = float64(len(lat))
	logf("move latency over %d moves: p50 %.0f ms, p99 %.0f ms", len(lat), res.Values["move_latency_p50_ms"], res.Values["move_latency_p99_ms"])
	var tail []string
	for _, l := range lat[max(len(lat)-5, 0):] {
		tail = append(tail, fmt.Sprintf("%.0f", l*1000))
	}
	logf("the slowest moves (ms): %s", strings.Join(tail, ", "))
	// Where a move's time went: the controller's part (from the event that
	// woke the labeller to its patch returning), and one write's round
	// trip on this cluster now (the bench's own relabel).
	sort.Float64s(own)
	moved := e.ctrl.scrape()
	ctl := histBetween(m0, moved, "nvdriver_move_seconds")
	res.Values["move_controller_p50_ms"] = ctl.quantile(0.5) * 1000
	res.Values["move_controller_p99_ms"] = ctl.quantile(0.99) * 1000
	res.Values["move_relabel_p50_ms"] = percentile(own, 50) * 1000
	res.Values["move_relabel_p99_ms"] = percentile(own, 99) * 1000
	logf("moves: the controller's part (%.0f timed) p50 %.0f ms, p99 %.0f ms (histogram buckets); the bench's relabel PATCH p50 %.0f ms, p99 %.0f ms",
		ctl.count(), res.Values["move_controller_p50_ms"], res.Values["move_controller_p99_ms"], res.Values["move_relabel_p50_ms"], res.Values["move_relabel_p99_ms"])
	// The controller's part, split: the API server answering the labeller's
	// patch, and the rest (docs/design.md, "Whose time a transition is").
	for _, part := range []string{"answer", "own"} {
		h := histBetween(m0, moved, "nvdriver_move_part_seconds", "part", part)
		res.Values["move_"+part+"_p50_ms"] = h.quantile(0.5) * 1000
		res.Values["move_"+part+"_p99_ms"] = h.quantile(0.99) * 1000
	}
	logf("moves: of the controller's part, the API server answering its patch p50 %.0f ms p99 %.0f ms; the rest (the labeller's turn and pass) p50 %.0f ms p99 %.0f ms",
		res.Values["move_answer_p50_ms"], res.Values["move_answer_p99_ms"], res.Values["move_own_p50_ms"], res.Values["move_own_p99_ms"])
	if err := e.waitAllReady(20 * time.Minute); err != nil {
		return err
	}
	m1, c1 := e.ctrl.scrape(), e.ctrl.cpuSeconds()
	rec := m1.sum("controller_runtime_reconcile_total", nil) - m0.sum("controller_runtime_reconcile_total", nil)
	if rec > 0 {
		res.Values["cpu_seconds_per_1000_reconciles"] = (c1 - c0) / rec * 1000
		res.Values["reconciles_during_moves"] = rec
	}
	logf("moves done: %.0f reconciles, %.2f CPU s per 1,000 reconciles", rec, res.Values["cpu_seconds_per_1000_reconciles"])
	logf("moves: %s", passesBetween("moves", m0, m1))
	return nil
}
