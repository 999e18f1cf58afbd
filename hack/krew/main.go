// Command krew packages the plugin for krew: it puts each platform's binary,
// LICENSE and the completion script into a release archive in dist/, and
// renders plugins.yaml into krew/nvdriver.yaml with each archive's URL and
// sha256, as krew-release-bot would for a release.
//
// usage: go run ./hack/krew -tag v0.1.0 -dist dist -platforms linux/amd64,...
package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"
)

func main() {
	tag := flag.String("tag", "", "release tag (semver with a leading v)")
	dist := flag.String("dist", "dist", "directory with bin/<os>_<arch>/ builds; archives are written here")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64", "platforms to package")
	tmpl := flag.String("template", "plugins.yaml", "krew manifest template")
	out := flag.String("out", "krew/nvdriver.yaml", "rendered manifest")
	missingOK := flag.Bool("missing-ok", false, "render platforms without an archive with the sha256 of an empty file (for tests that build one platform)")
	flag.Parse()
	if err := run(*tag, *dist, strings.Split(*platforms, ","), *tmpl, *out, *missingOK); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(tag, dist string, platforms []string, tmplPath, out string, missingOK bool) error {
	if !strings.HasPrefix(tag, "v") {
		return fmt.Errorf("-tag %q must start with v (krew needs a semantic version)", tag)
	}
	shas := map[string]string{}
	for _, p := range platforms {
		osArch := strings.Replace(p, "/", "_", 1)
		goos := strings.SplitN(p, "/", 2)[0]
		bin := "kubectl-nvdriver"
		if goos == "windows" {
			bin += ".exe"
		}
		files := map[string]string{
			bin:       filepath.Join(dist, "bin", osArch, bin),
			"LICENSE": "LICENSE",
		}
		if goos != "windows" {
			files["kubectl_complete-nvdriver"] = filepath.Join("hack", "krew", "kubectl_complete-nvdriver")
		}
		name := fmt.Sprintf("kubectl-nvdriver_%s_%s", tag, osArch)
		var data []byte
		var err error
		if goos == "windows" {
			name += ".zip"
			data, err = zipArchive(files)
		} else {
			name += ".tar.gz"
			data, err = tarArchive(files)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dist, name), data, 0o644); err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		shas[name] = hex.EncodeToString(sum[:])
		fmt.Printf("%s  %s\n", shas[name], filepath.Join(dist, name))
	}
	src, err := os.ReadFile(tmplPath)
	if err != nil {
		return err
	}
	t, err := template.New("plugin").Funcs(template.FuncMap{
		"addURIAndSha": func(url, tag string) (string, error) {
			url = strings.ReplaceAll(url, "{{ .TagName }}", tag)
			base := url[strings.LastIndex(url, "/")+1:]
			sha, ok := shas[base]
			if !ok && missingOK {
				// The sha256 of nothing: a valid-looking value that never matches a
				// real archive (and that YAML cannot read as a number).
				sha, ok = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", true
			}
			if !ok {
				return "", fmt.Errorf("no archive %s in %s (package that platform too)", base, dist)
			}
			return fmt.Sprintf("uri: %s\n    sha256: %s", url, sha), nil
		},
	}).Parse(string(src))
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, struct{ TagName string }{tag}); err != nil {
		return err
	}
	// Drop the template's leading comment: the rendered file is data.
	lines := strings.Split(buf.String(), "\n")
	for len(lines) > 0 && strings.HasPrefix(lines[0], "#") {
		lines = lines[1:]
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(strings.Join(lines, "\n")), 0o644)
}

func tarArchive(files map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, name := range sortedKeys(files) {
		data, err := os.ReadFile(files[name])
		if err != nil {
			return nil, err
		}
		mode := int64(0o644)
		if name != "LICENSE" {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func zipArchive(files map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, name := range sortedKeys(files) {
		f, err := os.Open(files[name])
		if err != nil {
			return nil, err
		}
		w, err := zw.Create(name)
		if err == nil {
			_, err = io.Copy(w, f)
		}
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
