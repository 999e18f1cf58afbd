package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// statusWatch is a running `kubectl nvdriver status NAME -w -o json`.
type statusWatch struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    strings.Builder
	errOut lockedBuffer
	done   chan error
}

// lockedBuffer is a strings.Builder safe for a process writing and a test reading.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func (w *statusWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(p)
}

func (w *statusWatch) len() int { w.mu.Lock(); defer w.mu.Unlock(); return w.out.Len() }

func (w *statusWatch) since(i int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()[i:]
}

func startStatusWatch(t *testing.T, name string) *statusWatch {
	return startStatusWatchWith(t, name, kubeconfig)
}

// startStatusWatchWith is startStatusWatch through the kubeconfig kc.
func startStatusWatchWith(t *testing.T, name, kc string) *statusWatch {
	t.Helper()
	w := &statusWatch{done: make(chan error, 1)}
	w.cmd = exec.Command(filepath.Join(binDir, "kubectl-nvdriver"), "status", name, "-w", "-o", "json")
	w.cmd.Env = append(os.Environ(), "KUBECONFIG="+kc, "NO_COLOR=1")
	w.cmd.Stdout, w.cmd.Stderr = w, &w.errOut
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.done <- w.cmd.Wait() }()
	t.Cleanup(func() { _ = w.cmd.Process.Kill() })
	eventually(t, 30*time.Second, "the first status -w frame", func() error {
		if !strings.Contains(w.since(0), `"name": "`+name+`"`) {
			return fmt.Errorf("no frame yet")
		}
		return nil
	})
	return w
}

// stop interrupts the watch as Ctrl-C would: it ends cleanly, and it never
// printed the same frame twice in a row (stdout is not a terminal here).
func (w *statusWatch) stop(t *testing.T) {
	t.Helper()
	_ = w.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-w.done:
		if err != nil {
			t.Errorf("status -w ended with %v on Ctrl-C", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("status -w did not end on Ctrl-C")
	}
	frames := regexp.MustCompile(`(?m)^--- \S+\n`).Split(w.since(0), -1)
	for i := 2; i < len(frames); i++ {
		if frames[i] == frames[i-1] {
			t.Errorf("status -w printed the same frame twice in a row:\n%s", frames[i])
		}
	}
	t.Logf("status -w printed %d frames across the outage", len(frames)-1)
}

// ---- leader election ----
