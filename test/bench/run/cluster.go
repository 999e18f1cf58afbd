package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// ---- nodes, watched through one metadata informer ----

type nodeWatch struct {
	store   cache.Store
	mu      sync.Mutex
	waiters map[string][]waiter
}

type waiter struct {
	cond func(*metav1.PartialObjectMetadata) bool
	ch   chan time.Time
}

func watchNodes(cfg *rest.Config) (*nodeWatch, error) {
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	f := metadatainformer.NewSharedInformerFactory(mc, 0)
	inf := f.ForResource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}).Informer()
	w := &nodeWatch{store: inf.GetStore(), waiters: map[string][]waiter{}}
	check := func(obj any) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return
		}
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		keep := w.waiters[m.Name][:0]
		for _, wt := range w.waiters[m.Name] {
			if wt.cond(m) {
				wt.ch <- now
			} else {
				keep = append(keep, wt)
			}
		}
		w.waiters[m.Name] = keep
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: check, UpdateFunc: func(_, n any) { check(n) }})
	stop := make(chan struct{})
	go inf.Run(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		return nil, fmt.Errorf("node informer did not sync")
	}
	return w, nil
}

func (w *nodeWatch) waitFor(name string, cond func(*metav1.PartialObjectMetadata) bool) chan time.Time {
	ch := make(chan time.Time, 1)
	w.mu.Lock()
	w.waiters[name] = append(w.waiters[name], waiter{cond, ch})
	w.mu.Unlock()
	return ch
}

func (w *nodeWatch) count(f func(*metav1.PartialObjectMetadata) bool) int {
	n := 0
	for _, o := range w.store.List() {
		if m, ok := o.(*metav1.PartialObjectMetadata); ok && m.Labels[groupLabel] != "" && f(m) {
			n++
		}
	}
	return n
}

func (w *nodeWatch) owned() int {
	return w.count(func(m *metav1.PartialObjectMetadata) bool { return m.Labels[plan.LabelOwner] != "" })
}

func (w *nodeWatch) ownedBy(cr string) int {
	return w.count(func(m *metav1.PartialObjectMetadata) bool { return m.Labels[plan.LabelOwner] == cr })
}

func (w *nodeWatch) ownedByInState(cr, s string) int {
	return w.count(func(m *metav1.PartialObjectMetadata) bool {
		return m.Labels[plan.LabelOwner] == cr && m.Labels[upgrade.LabelState] == s
	})
}

// ownedInMachine counts the CR's nodes in the upgrade machine: marked
// upgrade-required or past it, not done.
func (w *nodeWatch) ownedInMachine(cr string) int {
	return w.count(func(m *metav1.PartialObjectMetadata) bool {
		s := m.Labels[upgrade.LabelState]
		return m.Labels[plan.LabelOwner] == cr && s != "" && s != upgrade.StateDone
	})
}

// ---- a request-counting proxy for the plugin ----

type countingProxy struct {
	ln         net.Listener
	kubeconfig string
	count      atomic.Int64
}

func newCountingProxy(cfg *rest.Config) (*countingProxy, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = rt
	p := &countingProxy{}
	if p.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	go func() {
		_ = http.Serve(p.ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p.count.Add(1)
			rp.ServeHTTP(w, r)
		}))
	}()
	dir, err := os.MkdirTemp("", "nvdriver-bench")
	if err != nil {
		return nil, err
	}
	p.kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: bench, cluster: {server: %q}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: bench, context: {cluster: bench, user: u}}]\ncurrent-context: bench\n", "http://"+p.ln.Addr().String())
	return p, os.WriteFile(p.kubeconfig, []byte(kc), 0o600)
}

func (p *countingProxy) close() { _ = p.ln.Close() }
