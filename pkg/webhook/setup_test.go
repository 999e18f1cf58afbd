package webhook

import (
	"strings"
	"testing"
	"time"
)

func TestOptionsValidate(t *testing.T) {
	ok := Options{BindAddress: ":9443", Service: "nvdriver-webhook", Certs: CertsSelf, Validity: time.Hour}
	cases := []struct {
		name string
		mut  func(*Options)
		want string // "" = valid
	}{
		{"service", func(*Options) {}, ""},
		{"off", func(o *Options) { *o = Options{} }, ""},
		{"url", func(o *Options) { o.Service, o.URL = "", "https://127.0.0.1:9443" }, ""},
		{"both", func(o *Options) { o.URL = "https://127.0.0.1:9443" }, "not both"},
		{"neither", func(o *Options) { o.Service = "" }, "needs a Service name or a URL"},
		{"http url", func(o *Options) { o.Service, o.URL = "", "http://127.0.0.1:9443" }, "want https://HOST[:PORT]"},
		{"url with a path", func(o *Options) { o.Service, o.URL = "", "https://127.0.0.1:9443/x" }, "the path " + Path + " is added"},
		{"no port", func(o *Options) { o.BindAddress = "127.0.0.1" }, "--webhook-bind-address"},
		{"external without a directory", func(o *Options) { o.Certs = CertsExternal }, "needs --webhook-cert-dir"},
		{"external", func(o *Options) { o.Certs, o.CertDir, o.Service = CertsExternal, "/certs", "" }, ""},
		{"unknown mode", func(o *Options) { o.Certs = "vault" }, `--webhook-certs "vault"`},
		{"too short", func(o *Options) { o.Validity = time.Second }, "at least 10s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := ok
			c.mut(&o)
			err := o.Validate("gpu-operator")
			switch {
			case c.want == "" && err != nil:
				t.Fatal(err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
}

func TestEndpointHosts(t *testing.T) {
	if got := (Endpoint{URL: "https://127.0.0.1:9443"}).Hosts(); strings.Join(got, ",") != "127.0.0.1" {
		t.Fatal(got)
	}
	got := Endpoint{Service: "nvdriver-webhook", Namespace: "gpu-operator"}.Hosts()
	if got[0] != "nvdriver-webhook.gpu-operator.svc" || len(got) != 4 {
		t.Fatal(got)
	}
}
