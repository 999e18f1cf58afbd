package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// clusterProcs are the local cluster's processes (kwokctl's binary runtime)
// by command name, as the kernel keeps it (15 characters at most).
var clusterProcs = map[string]string{
	"kube-apiserver":  "kube-apiserver",
	"etcd":            "etcd",
	"kube-controller": "kube-controller-manager",
	"kube-scheduler":  "kube-scheduler",
	"kwok-controller": "kwok",
}

// cpuSample is the CPU seconds (user+system) of the cluster's processes by
// name, and the machine's busy and total CPU seconds (/proc/stat), at one
// moment: two samples give where a phase's CPU went.
type cpuSample struct {
	procs              map[string]float64
	busy, steal, total float64
}

func sampleCPU() cpuSample {
	s := cpuSample{procs: map[string]float64{}}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		comm, err := os.ReadFile(dir + "/comm")
		if err != nil {
			continue
		}
		name, ok := clusterProcs[strings.TrimSpace(string(comm))]
		if !ok {
			continue
		}
		s.procs[name] += statCPUSeconds(dir + "/stat")
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
		for i, v := range f[1:] {
			x, _ := strconv.ParseFloat(v, 64)
			if i >= 8 { // guest time is counted in user already
				break
			}
			s.total += x / 100
			switch i {
			case 3, 4: // idle, iowait
			case 7:
				s.steal += x / 100 // the hypervisor's: not ours to use
			default:
				s.busy += x / 100
			}
		}
	}
	return s
}

// statCPUSeconds is a process's user+system time from its stat file.
func statCPUSeconds(path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// cpuBetween says where the machine's CPU went between two samples, in
// cores (CPU seconds per second of the phase): the controller's (its own
// CPU seconds over the phase, ctrl), each cluster process's, and the rest;
// and how busy the machine was. It records the values under phase.
func cpuBetween(phase string, a, b cpuSample, ctrl, seconds float64) string {
	if seconds <= 0 || b.total <= a.total {
		return "no sample"
	}
	cores := (b.total - a.total) / seconds
	busy := (b.busy - a.busy) / seconds
	res.Values[phase+"_machine_busy_cores"] = busy
	res.Values[phase+"_controller_cores"] = ctrl / seconds
	names := make([]string, 0, len(b.procs))
	for n := range b.procs {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return b.procs[names[i]]-a.procs[names[i]] > b.procs[names[j]]-a.procs[names[j]] })
	steal := (b.steal - a.steal) / seconds
	res.Values[phase+"_machine_steal_cores"] = steal
	parts := []string{fmt.Sprintf("machine %.2f of %.0f cores busy (%.2f stolen by the hypervisor)", busy, cores, steal), fmt.Sprintf("nvdriver controller %.3f", ctrl/seconds)}
	rest := busy - ctrl/seconds
	for _, n := range names {
		c := (b.procs[n] - a.procs[n]) / seconds
		res.Values[phase+"_cores_"+n] = c
		parts = append(parts, fmt.Sprintf("%s %.2f", n, c))
		rest -= c
	}
	parts = append(parts, fmt.Sprintf("everything else (the bench, the kernel) %.2f", max(rest, 0)))
	return strings.Join(parts, ", ")
}
