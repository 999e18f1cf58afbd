package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// With no cluster configured, a command says so and names the kubeconfig it
// tried, instead of "connection refused" from localhost:8080.
func TestNoClusterConfigured(t *testing.T) {
	t.Setenv("KUBECONFIG", "/nonexistent/kubeconfig")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, args := range [][]string{{"status"}, {"preview"}, {"doctor"}, {"upgrade", "x", "--to", "550.90.07"}} {
		var out, errOut bytes.Buffer
		code := MainContext(context.Background(), args, strings.NewReader(""), &out, &errOut)
		if code != ExitError || !strings.Contains(errOut.String(), "no cluster is configured") || !strings.Contains(errOut.String(), "/nonexistent/kubeconfig") ||
			strings.Contains(errOut.String(), "localhost:8080") {
			t.Errorf("%v: exit %d\n%s", args, code, errOut.String())
		}
	}
}
