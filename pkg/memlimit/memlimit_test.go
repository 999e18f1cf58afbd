package memlimit

import (
	"math"
	"runtime/debug"
	"testing"
)

func TestApply(t *testing.T) {
	defer debug.SetMemoryLimit(math.MaxInt64)
	cases := []struct {
		name, gomemlimit, limit string
		want                    int64
		wantErr                 bool
	}{
		{"no limit", "", "", 0, false},
		{"a quantity", "", "256Mi", 128 << 20, false},
		{"bytes, as the downward API gives them", "", "268435456", 128 << 20, false},
		{"unlimited container (the downward API gives 0)", "", "0", 0, false},
		{"GOMEMLIMIT wins", "100MiB", "256Mi", 0, false},
		{"garbage", "", "a lot", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			t.Setenv("GOMEMLIMIT", tc.gomemlimit)
			t.Setenv(EnvContainerLimit, tc.limit)
			got, err := Apply()
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("Apply() = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
			runtime := debug.SetMemoryLimit(-1)
			if tc.want > 0 && runtime != tc.want {
				t.Errorf("runtime soft limit %d, want %d", runtime, tc.want)
			}
			if tc.want == 0 && runtime != math.MaxInt64 {
				t.Errorf("runtime soft limit %d set, want none", runtime)
			}
		})
	}
}
