// Package output renders the plugin's output: tables in kubectl's look
// (no borders, upper-case headers, left aligned), colour bound to the output
// stream, and stable JSON/YAML.
package output

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"
	"github.com/olekukonko/tablewriter"
	"github.com/olekukonko/tablewriter/renderer"
	"github.com/olekukonko/tablewriter/tw"
	"sigs.k8s.io/yaml"
)

// Table writes rows under upper-case headers, kubectl style: columns split by
// three spaces, no borders, no lines.
func Table(w io.Writer, headers []string, rows [][]string) error {
	var buf bytes.Buffer
	t := tablewriter.NewTable(&buf,
		tablewriter.WithRenderer(renderer.NewBlueprint(tw.Rendition{
			Borders: tw.BorderNone,
			Symbols: tw.NewSymbolCustom("kubectl").WithColumn(" "),
			Settings: tw.Settings{
				Separators: tw.Separators{ShowHeader: tw.Off, ShowFooter: tw.Off, BetweenRows: tw.Off, BetweenColumns: tw.On},
				Lines:      tw.Lines{ShowTop: tw.Off, ShowBottom: tw.Off, ShowHeaderLine: tw.Off, ShowFooterLine: tw.Off},
			},
		})),
		tablewriter.WithConfig(tablewriter.Config{
			Header: tw.CellConfig{
				Alignment:  tw.CellAlignment{Global: tw.AlignLeft},
				Formatting: tw.CellFormatting{AutoFormat: tw.Off, AutoWrap: tw.WrapNone},
				Padding:    tw.CellPadding{Global: tw.Padding{Left: tw.Empty, Right: " ", Overwrite: true}},
			},
			Row: tw.CellConfig{
				Alignment:  tw.CellAlignment{Global: tw.AlignLeft},
				Formatting: tw.CellFormatting{AutoWrap: tw.WrapNone},
				Padding:    tw.CellPadding{Global: tw.Padding{Left: tw.Empty, Right: " ", Overwrite: true}},
			},
		}),
	)
	up := make([]any, len(headers))
	for i, h := range headers {
		up[i] = strings.ToUpper(h)
	}
	t.Header(up...)
	for _, r := range rows {
		cells := make([]any, len(r))
		for i, c := range r {
			cells[i] = c
		}
		if err := t.Append(cells...); err != nil {
			return err
		}
	}
	if err := t.Render(); err != nil {
		return err
	}
	// The renderer pads the last column; kubectl does not.
	for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		if _, err := fmt.Fprintln(w, strings.TrimRight(line, " ")); err != nil {
			return err
		}
	}
	return nil
}

// JSON writes v indented, with a trailing newline.
func JSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// YAML writes v as YAML.
func YAML(w io.Writer, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

// Styles colours text for one output stream. Colour is on only when the
// stream is a terminal, NO_COLOR is unset and --no-color was not given.
type Styles struct {
	r       *lipgloss.Renderer
	enabled bool
}

// NewStyles binds colour to w.
func NewStyles(w io.Writer, noColor bool) *Styles {
	r := lipgloss.NewRenderer(w)
	enabled := !noColor && os.Getenv("NO_COLOR") == "" && IsTerminal(w)
	if !enabled {
		r.SetColorProfile(termenv.Ascii)
	}
	return &Styles{r: r, enabled: enabled}
}

// Enabled reports whether colour is on.
func (s *Styles) Enabled() bool { return s.enabled }

func (s *Styles) paint(color, text string) string {
	if !s.enabled {
		return text
	}
	return s.r.NewStyle().Foreground(lipgloss.Color(color)).Render(text)
}

// OK, Warn, Bad and Dim colour a word by meaning.
func (s *Styles) OK(t string) string   { return s.paint("2", t) }
func (s *Styles) Warn(t string) string { return s.paint("3", t) }
func (s *Styles) Bad(t string) string  { return s.paint("1", t) }
func (s *Styles) Dim(t string) string  { return s.paint("8", t) }

// IsTerminal reports whether w is a character device (a TTY).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Errorf formats an error kubectl style.
func Errorf(w io.Writer, format string, a ...any) {
	fmt.Fprintf(w, "error: "+format+"\n", a...)
}
