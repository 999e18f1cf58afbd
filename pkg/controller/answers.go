package controller

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"
)

// answerClock sums how long the API server took to answer the requests made
// under one context: a node's step in an upgrade pass, from the request sent
// to its body read. It is how a transition's latency is split into the API
// server's part and the controller's (docs/design.md, "Whose time a
// transition is").
type answerClock struct {
	now   func() time.Time
	mu    sync.Mutex
	total time.Duration
}

type answerClockKey struct{}

// withAnswerClock returns ctx with a new clock, reading now, that
// TimeAnswers feeds.
func withAnswerClock(ctx context.Context, now func() time.Time) (context.Context, *answerClock) {
	c := &answerClock{now: now}
	return context.WithValue(ctx, answerClockKey{}, c), c
}

// answered is the time the requests made so far took to be answered.
func (c *answerClock) answered() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

func (c *answerClock) add(d time.Duration) {
	c.mu.Lock()
	c.total += d
	c.mu.Unlock()
}

// TimeAnswers wraps a client transport so that a request whose context holds
// an answer clock adds its round trip to it: from the request sent until its
// body is closed (client-go reads the whole body, then closes it), or until
// the error. The client's rate limiter waits before the transport and is not
// counted. Requests without a clock (the caches' watches, most reads) pass
// untouched.
func TimeAnswers(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		c, _ := req.Context().Value(answerClockKey{}).(*answerClock)
		if c == nil {
			return rt.RoundTrip(req)
		}
		start := c.now()
		resp, err := rt.RoundTrip(req)
		if err != nil || resp.Body == nil {
			c.add(c.now().Sub(start))
			return resp, err
		}
		resp.Body = &timedBody{ReadCloser: resp.Body, clock: c, start: start}
		return resp, nil
	})
}

// timedBody ends its request's round trip when it is closed.
type timedBody struct {
	io.ReadCloser
	clock *answerClock
	start time.Time
	once  sync.Once
}

func (b *timedBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.clock.add(b.clock.now().Sub(b.start)) })
	return err
}

// stepClock times one node's step in a pass, to split its transition's
// latency by whose time it was (upgradeTransitionParts).
type stepClock struct {
	ctx              context.Context // the pass's, with the step's answer clock
	answers          *answerClock
	now              func() time.Time
	decided, started time.Time
}

// newStepClock starts timing a step the pass decided at decided: from then
// until a worker takes it (start) it waits for one.
func (r *UpgradeReconciler) newStepClock(ctx context.Context, decided time.Time) *stepClock {
	sctx, c := withAnswerClock(ctx, r.latencyNow)
	return &stepClock{ctx: sctx, answers: c, now: r.latencyNow, decided: decided}
}

func (r *UpgradeReconciler) latencyNow() time.Time {
	if r.latencyClock != nil {
		return r.latencyClock()
	}
	return time.Now()
}

func (s *stepClock) start() { s.started = s.now() }

// observe records a transition into to written now, in a pass that started
// at passStart: its whole latency and its parts. Own is what is left when
// the answers and the wait for a worker are taken out: the pass's work
// before it decided the step, and the step's own between its requests.
func (s *stepClock) observe(to string, passStart time.Time) {
	total := s.now().Sub(passStart)
	answer, worker := s.answers.answered(), s.started.Sub(s.decided)
	upgradeTransition.WithLabelValues(to).Observe(total.Seconds())
	upgradeTransitionParts.WithLabelValues(to, "answer").Observe(answer.Seconds())
	upgradeTransitionParts.WithLabelValues(to, "worker").Observe(worker.Seconds())
	upgradeTransitionParts.WithLabelValues(to, "own").Observe(max(total-answer-worker, 0).Seconds())
}
