package e2e

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// nodeCounter samples the nodes labelled key=yes every 100 ms and keeps the
// largest number of them at once that match, with their names and states at
// that moment: "at most N cordoned", "at most N out of service".
type nodeCounter struct {
	mu         sync.Mutex
	worst      int
	worstNodes []string
	stop, done chan struct{}
}

func countNodes(key string, match func(*corev1.Node) bool) *nodeCounter {
	c := &nodeCounter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
			}
			nl := &corev1.NodeList{}
			if err := k8s.List(context.Background(), nl, client.MatchingLabels{key: "yes"}); err != nil {
				continue
			}
			var names []string
			for i := range nl.Items {
				if match(&nl.Items[i]) {
					names = append(names, nl.Items[i].Name+"("+nl.Items[i].Labels[upgrade.LabelState]+")")
				}
			}
			c.mu.Lock()
			if len(names) > c.worst {
				c.worst, c.worstNodes = len(names), names
			}
			c.mu.Unlock()
		}
	}()
	return c
}

// finish stops the sampler and returns the most nodes that matched at once.
func (c *nodeCounter) finish() (int, []string) {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.worst, c.worstNodes
}

func cordoned(n *corev1.Node) bool { return n.Spec.Unschedulable }
