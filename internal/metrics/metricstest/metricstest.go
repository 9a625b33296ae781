package metricstest

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// Scrape fetches url and parses it as the Prometheus text format, with
// the classic name rules (no UTF-8 names).
func Scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// Samples flattens the counters and gauges (and untyped samples) of the
// families named prefix* to `name{label="value",...}` (labels sorted) ->
// value. Histograms are left out.
func Samples(fams map[string]*dto.MetricFamily, prefix string) map[string]float64 {
	out := map[string]float64{}
	for name, f := range fams {
		if !strings.HasPrefix(name, prefix) || f.GetType() == dto.MetricType_HISTOGRAM {
			continue
		}
		for _, m := range f.Metric {
			var v float64
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			default:
				v = m.GetUntyped().GetValue()
			}
			out[SampleKey(name, m.Label)] = v
		}
	}
	return out
}

// SampleKey is a sample's key in Samples: `name{label="value",...}`,
// labels sorted.
func SampleKey(name string, labels []*dto.LabelPair) string {
	var ls []string
	for _, l := range labels {
		ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(ls)
	return name + "{" + strings.Join(ls, ",") + "}"
}
