package main

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

// plugin: preview and status against `kubectl get nodes -o name`, wall time
// and peak RSS (medians), and the requests each makes (through a counting proxy).
func (e *env) plugin() error {
	cmds := []struct {
		key  string
		argv []string
	}{
		{"kubectl_get_nodes", []string{"kubectl", "get", "nodes", "-o", "name"}},
		// No registry: the bench measures the API side (the image checks are in "registry").
		{"preview", []string{"bin/kubectl-nvdriver", "preview", "--check-images=false"}},
		{"status", []string{"bin/kubectl-nvdriver", "status"}},
	}
	wall := map[string][]float64{}
	rss := map[string][]float64{}
	for range *runs { // interleaved, so drift hits all alike
		for _, c := range cmds {
			w, r, err := timeCmd(e.kubeconfig, c.argv)
			if err != nil && !(c.key == "preview" && isExit3(err)) {
				return err
			}
			wall[c.key] = append(wall[c.key], w)
			rss[c.key] = append(rss[c.key], r)
		}
	}
	for _, c := range cmds {
		res.Values[c.key+"_ms"] = median(wall[c.key])
		res.Values[c.key+"_rss_mib"] = median(rss[c.key])
	}
	for _, k := range []string{"preview", "status"} {
		res.Values[k+"_ratio"] = res.Values[k+"_ms"] / res.Values["kubectl_get_nodes_ms"]
	}
	p, err := newCountingProxy(e.cfg)
	if err != nil {
		return err
	}
	defer p.close()
	for _, c := range cmds {
		before := p.count.Load()
		if _, _, err := timeCmd(p.kubeconfig, c.argv); err != nil && !isExit3(err) {
			return err
		}
		res.Values[c.key+"_requests"] = float64(p.count.Load() - before)
	}
	logf("preview %.0f ms (%.2f×, %v requests), status %.0f ms (%.2f×, %v requests), kubectl get nodes -o name %.0f ms (%v requests)",
		res.Values["preview_ms"], res.Values["preview_ratio"], res.Values["preview_requests"],
		res.Values["status_ms"], res.Values["status_ratio"], res.Values["status_requests"],
		res.Values["kubectl_get_nodes_ms"], res.Values["kubectl_get_nodes_requests"])
	return nil
}

func isExit3(err error) bool {
	ee, ok := err.(*exec.ExitError)
	return ok && ee.ExitCode() == 3
}

// timeCmd runs argv and returns its wall time (ms) and peak RSS (MiB).
func timeCmd(kubeconfig string, argv []string) (float64, float64, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "NO_COLOR=1")
	t0 := time.Now()
	err := cmd.Run()
	wall := float64(time.Since(t0).Microseconds()) / 1000
	var rssMiB float64
	if cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			rssMiB = float64(ru.Maxrss) / 1024
		}
	}
	return wall, rssMiB, err
}
