package e2e

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// faultProxy sits between a client and kube-apiserver: plain HTTP on
// loopback in front, the admin's TLS credentials behind (impersonation
// headers pass through, so the client keeps its identity). It injects
// faults into what passes and counts it.
type faultProxy struct {
	addr string
	srv  *http.Server
	// errorRate is the share of writes answered 429 or 500 (0..1), readRate
	// that of reads; drop closes every connection unanswered (a partition).
	mu        sync.Mutex
	errorRate float64
	readRate  float64
	drop      bool
	requests  atomic.Int64
	writes    atomic.Int64 // writes forwarded to kube-apiserver
	injected  atomic.Int64 // requests answered with an injected error
	dropped   atomic.Int64
	conns     map[net.Conn]bool // open client connections, for cut
}

func startFaultProxy(t *testing.T) *faultProxy {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(cfg.Host)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = rt
	rp.FlushInterval = -1 // watches stream
	p := &faultProxy{conns: map[net.Conn]bool{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = l.Addr().String()
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		p.mu.Lock()
		rate, readRate, drop := p.errorRate, p.readRate, p.drop
		p.mu.Unlock()
		write := r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions
		if !write {
			rate = readRate
		}
		switch {
		case drop:
			p.dropped.Add(1)
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					conn.Close()
					return
				}
			}
			panic(http.ErrAbortHandler)
		case rate > 0 && rand.Float64() < rate:
			p.injected.Add(1)
			code, reason := http.StatusTooManyRequests, "TooManyRequests"
			if rand.IntN(2) == 0 {
				code, reason = http.StatusInternalServerError, "InternalError"
			}
			if code == http.StatusTooManyRequests {
				w.Header().Set("Retry-After", "1")
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected by the e2e fault proxy","reason":%q,"code":%d}`, reason, code)
			return
		}
		if write {
			p.writes.Add(1)
		}
		rp.ServeHTTP(w, r)
	})}
	p.srv.ConnState = func(c net.Conn, st http.ConnState) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch st {
		case http.StateNew:
			p.conns[c] = true
		case http.StateClosed, http.StateHijacked:
			delete(p.conns, c)
		}
	}
	go func() { _ = p.srv.Serve(l) }()
	t.Cleanup(func() { _ = p.srv.Close() })
	return p
}

// readErrors sets the share of reads answered 429 or 500.
func (p *faultProxy) readErrors(rate float64) {
	p.mu.Lock()
	p.readRate = rate
	p.mu.Unlock()
}

func (p *faultProxy) set(errorRate float64, drop bool) {
	p.mu.Lock()
	p.errorRate, p.drop = errorRate, drop
	p.mu.Unlock()
}

// cut drops every new request and closes every open connection, watches
// included: a partition that also breaks established streams.
func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// kubeconfig writes a kubeconfig that reaches kube-apiserver through the
// proxy, impersonating user (none when empty).
func (p *faultProxy) kubeconfig(t *testing.T, user string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxy"] = &clientcmdapi.Cluster{Server: "http://" + p.addr}
	cfg.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{Impersonate: user}
	cfg.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	cfg.CurrentContext = "proxy"
	f, err := os.CreateTemp(t.TempDir(), "proxy-kubeconfig-*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := clientcmd.WriteToFile(*cfg, f.Name()); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}
