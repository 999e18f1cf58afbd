package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nvdriver/nvdriver/pkg/memlimit"
)

// ---- the controller process ----

// chartMemoryLimit is the Helm chart's default controller memory limit.
const chartMemoryLimit = "256Mi"

// chartGOMAXPROCS is what the Helm chart's default CPU limit (500m) gives
// the controller: the limit in whole cores, rounded up.
const chartGOMAXPROCS = 1

type controllerProc struct {
	cmd     *exec.Cmd
	port    int
	pprof   int
	logPath string
	done    chan struct{}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 18090
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startController(kubeconfig, tag string, extra ...string) (*controllerProc, error) {
	p := &controllerProc{port: freePort(), pprof: freePort(), done: make(chan struct{})}
	p.logPath = filepath.Join(os.TempDir(), fmt.Sprintf("nvdriver-bench-controller-%s.log", tag))
	f, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(filepath.Join(root, "bin", "controller"), "--kubeconfig", kubeconfig, "--namespace", namespace,
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", p.port), "--health-probe-bind-address", "127.0.0.1:0",
		"--pprof-bind-address", fmt.Sprintf("127.0.0.1:%d", p.pprof))
	p.cmd.Args = append(p.cmd.Args, extra...)
	// As the Helm chart runs it: its default memory limit (SPEC §6), from
	// which the controller sets its soft limit, and its CPU limit as Go
	// threads (--controller-gomaxprocs 0: Go's default instead).
	p.cmd.Env = append(os.Environ(), memlimit.EnvContainerLimit+"="+chartMemoryLimit)
	if *maxProcs > 0 {
		p.cmd.Env = append(p.cmd.Env, fmt.Sprintf("GOMAXPROCS=%d", *maxProcs))
	}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

func (p *controllerProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *controllerProc) procStatus(key string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, key+":") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func (p *controllerProc) rssMiB() float64     { return p.procStatus("VmRSS") }
func (p *controllerProc) peakRSSMiB() float64 { return p.procStatus("VmHWM") }

// cpuSeconds is the process's user+system time.
func (p *controllerProc) cpuSeconds() float64 {
	return statCPUSeconds(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
}

func (p *controllerProc) logSize() int64 {
	st, err := os.Stat(p.logPath)
	if err != nil {
		return 0
	}
	return st.Size()
}

// reconciledAll: this process has reconciled every named CR (it publishes
// nvdriver_driver_state for a CR once it has computed its status).
func (p *controllerProc) reconciledAll(names []string) bool {
	m := p.scrape()
	for _, n := range names {
		if m.sum("nvdriver_driver_state", map[string]string{"name": n}) < 1 {
			return false
		}
	}
	return true
}

// quiet waits until no reconcile has run for d (bounded to 5 minutes).
func (p *controllerProc) quiet(d time.Duration) {
	deadline := time.Now().Add(5 * time.Minute)
	last, since := -1.0, time.Now()
	for time.Now().Before(deadline) {
		n := p.scrape().sum("controller_runtime_reconcile_total", nil)
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= d {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}
