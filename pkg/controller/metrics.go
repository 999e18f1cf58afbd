package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// driverState is 1 for the state each NVIDIADriver is in, 0 for the others.
var driverState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "nvdriver_driver_state",
	Help: "State of each NVIDIADriver: 1 for its current state (ready or notReady).",
}, []string{"name", "state"})

func init() {
	metrics.Registry.MustRegister(driverState)
}

func recordState(name string, state v1alpha1.State) {
	for _, s := range []v1alpha1.State{v1alpha1.Ready, v1alpha1.NotReady} {
		v := 0.0
		if s == state {
			v = 1
		}
		driverState.WithLabelValues(name, string(s)).Set(v)
	}
}

func forgetState(name string) {
	driverState.DeletePartialMatch(map[string]string{"name": name})
}
