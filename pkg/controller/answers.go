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

// withAnswerClock returns ctx with a new clock that TimeAnswers feeds.
func withAnswerClock(ctx context.Context) (context.Context, *answerClock) {
	c := &answerClock{now: time.Now}
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
