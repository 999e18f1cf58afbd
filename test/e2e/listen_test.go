package e2e

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
)

// listeners returns the local addresses of listening TCP sockets ("ip:port"),
// read from /proc/net/tcp and tcp6.
func listeners() (map[string]bool, error) {
	out := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "0A" { // 0A = LISTEN
				continue
			}
			out[decodeAddr(fields[1])] = true
		}
		fh.Close()
	}
	return out, nil
}

// decodeAddr turns /proc's hex "0100007F:1F90" into "127.0.0.1:8080".
func decodeAddr(s string) string {
	parts := strings.SplitN(s, ":", 2)
	var port int
	fmt.Sscanf(parts[1], "%X", &port)
	h := parts[0]
	if len(h) == 8 {
		var b [4]int
		for i := 0; i < 4; i++ {
			fmt.Sscanf(h[6-2*i:8-2*i], "%X", &b[i])
		}
		return fmt.Sprintf("%d.%d.%d.%d:%d", b[0], b[1], b[2], b[3], port)
	}
	switch h {
	case "00000000000000000000000000000000":
		return fmt.Sprintf("[::]:%d", port)
	case "00000000000000000000000001000000":
		return fmt.Sprintf("[::1]:%d", port)
	}
	return fmt.Sprintf("[%s]:%d", h, port)
}

// Every component of the local cluster listens on the loopback address only:
// an unauthenticated etcd on 0.0.0.0 would be open to the network.
func TestClusterListensOnLoopbackOnly(t *testing.T) {
	if listenersBefore == nil || listenersAfter == nil {
		t.Fatal("listening sockets were not recorded around the cluster start")
	}
	added := 0
	for addr := range listenersAfter {
		if listenersBefore[addr] {
			continue
		}
		added++
		if !strings.HasPrefix(addr, "127.") && !strings.HasPrefix(addr, "[::1]") {
			t.Errorf("the local cluster listens on %s, not on loopback", addr)
		}
	}
	if added < 4 {
		t.Errorf("only %d new listening sockets after the cluster started; expected etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok", added)
	}
}
