package controller

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeNow is a clock the test and the server's handler move by hand.
type fakeNow struct{ ns atomic.Int64 }

func (f *fakeNow) now() time.Time          { return time.Unix(0, f.ns.Load()) }
func (f *fakeNow) advance(d time.Duration) { f.ns.Add(int64(d)) }
func (f *fakeNow) clock() *answerClock     { return &answerClock{now: f.now} }
func withClock(c *answerClock) context.Context {
	return context.WithValue(context.Background(), answerClockKey{}, c)
}

// A request's answer lasts until its body is closed: the API server's
// answer time includes sending the body, which client-go reads whole.
func TestTimeAnswersCountsUntilTheBodyIsClosed(t *testing.T) {
	clk := &fakeNow{}
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		clk.advance(300 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-release
		clk.advance(200 * time.Millisecond)
		_, _ = w.Write([]byte(`{"kind":"PodList"}`))
	}))
	defer srv.Close()
	hc := &http.Client{Transport: TimeAnswers(http.DefaultTransport)}

	c := clk.clock()
	req, _ := http.NewRequestWithContext(withClock(c), http.MethodGet, srv.URL, nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.answered(); got != 0 {
		t.Errorf("counted %s with the body still coming; want nothing until it is closed", got)
	}
	close(release)
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	_ = resp.Body.Close() // a second close counts nothing more
	if got := c.answered(); got != 500*time.Millisecond {
		t.Errorf("answered %s, want 500ms (headers after 300, the body 200 later)", got)
	}

	// A second request under the same clock adds to it.
	req, _ = http.NewRequestWithContext(withClock(c), http.MethodGet, srv.URL, nil)
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if got := c.answered(); got != time.Second {
		t.Errorf("two answers of 500ms: %s", got)
	}

	// Without a clock the response is the transport's own.
	req, _ = http.NewRequest(http.MethodGet, srv.URL, nil)
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, wrapped := resp.Body.(*timedBody); wrapped {
		t.Error("a request without a clock had its body wrapped")
	}
	_ = resp.Body.Close()
}

// A request that fails is timed until the failure.
func TestTimeAnswersCountsAFailure(t *testing.T) {
	clk := &fakeNow{}
	rt := TimeAnswers(roundTripFunc(func(*http.Request) (*http.Response, error) {
		clk.advance(100 * time.Millisecond)
		return nil, errors.New("connection reset")
	}))
	c := clk.clock()
	req, _ := http.NewRequestWithContext(withClock(c), http.MethodPatch, "https://apiserver/api/v1/nodes/n", nil)
	if _, err := rt.RoundTrip(req); err == nil {
		t.Fatal("the error was lost")
	}
	if got := c.answered(); got != 100*time.Millisecond {
		t.Errorf("answered %s, want 100ms", got)
	}
}

// A step's parts add up to its latency: the answers and the wait for a
// worker are taken out of the time since its pass started, and what is
// left is the controller's own.
func TestStepClockSplitsATransition(t *testing.T) {
	const to = "test-state"
	sum := func(part string) float64 {
		return metricNow(t, upgradeTransitionParts.WithLabelValues(to, part).(prometheus.Metric)).GetHistogram().GetSampleSum()
	}
	total := func() float64 {
		return metricNow(t, upgradeTransition.WithLabelValues(to).(prometheus.Metric)).GetHistogram().GetSampleSum()
	}
	clk := &fakeNow{}
	passStart := clk.now()
	clk.advance(50 * time.Millisecond) // the pass decides
	answers := clk.clock()
	st := &stepClock{ctx: withClock(answers), answers: answers, now: clk.now, decided: clk.now()}
	clk.advance(200 * time.Millisecond) // every worker busy
	st.start()
	answers.add(400 * time.Millisecond) // the step's LIST and PATCH
	clk.advance(550 * time.Millisecond)
	before := map[string]float64{"answer": sum("answer"), "worker": sum("worker"), "own": sum("own"), "total": total()}
	st.observe(to, passStart)
	for part, want := range map[string]float64{"answer": 0.4, "worker": 0.2, "own": 0.2, "total": 0.8} {
		got := total() - before[part]
		if part != "total" {
			got = sum(part) - before[part]
		}
		if got < want-1e-9 || got > want+1e-9 {
			t.Errorf("%s: %.3f s, want %.3f", part, got, want)
		}
	}
}
