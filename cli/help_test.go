package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/uvm"
)

// cleanEnv unsets every variable of config.Settings (and the runtime
// directory) for the test: what the help prints then is the code's
// defaults, not this shell's choices.
func cleanEnv(t *testing.T) {
	t.Helper()
	for _, s := range config.Settings {
		t.Setenv(s.Env, "")
		os.Unsetenv(s.Env)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	os.Unsetenv("XDG_RUNTIME_DIR")
}

// helpOf is what `uvm help CMD` writes (flag sets write to standard
// error).
func helpOf(t *testing.T, cmd ...string) string {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved := os.Stderr
	os.Stderr = w
	var out bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&out, r); close(done) }()
	var stdout bytes.Buffer
	code := mainErr(append([]string{"help"}, cmd...), &stdout, w)
	os.Stderr = saved
	w.Close()
	<-done
	require.Equal(t, 0, code, out.String())
	return stdout.String() + out.String()
}

// flagDefaults reads flag.PrintDefaults's text: each flag's default as
// printed, "" where none is (the zero value).
func flagDefaults(t *testing.T, help string) map[string]string {
	t.Helper()
	defaults := map[string]string{}
	blocks := regexp.MustCompile(`(?m)^  -(\S+)(?: \S+)?\n((?:    \t.*(?:\n|$))+)`).FindAllStringSubmatch(help, -1)
	require.NotEmpty(t, blocks, help)
	for _, b := range blocks {
		d := ""
		if m := regexp.MustCompile(`\(default (.*)\)\n?$`).FindStringSubmatch(b[2]); m != nil {
			d = m[1]
			if u, err := strconv.Unquote(d); err == nil {
				d = u
			}
		}
		defaults[b[1]] = d
	}
	return defaults
}

// zeroPhrases are the defaults that name a flag's zero value, which
// flag.PrintDefaults does not print.
var zeroPhrases = map[string]bool{"one per CPU": true, "unbounded": true, "calibrated": true, config.SettingOf(config.EnvPreload).Default: true}

// meansDefault says whether a flag's printed default means s's default:
// the same text, the same boolean, the zero value a phrase names, or, for
// a server setting, a value that configures the same server.
func meansDefault(t *testing.T, s config.Setting, flagDefault string) bool {
	t.Helper()
	switch {
	case flagDefault == s.Default:
		return true
	case s.Default == "0" || s.Default == "1":
		return flagDefault == strconv.FormatBool(s.Default == "1") || (flagDefault == "" && s.Default == "0")
	case zeroPhrases[s.Default]:
		return flagDefault == ""
	case !s.Server:
		return false
	}
	configured := func(v string) config.ServerConfig {
		t.Setenv(s.Env, v)
		defer os.Unsetenv(s.Env)
		c, err := uvm.ServerConfigFromEnv()
		require.NoError(t, err, "%s=%q", s.Env, v)
		return c.Resolved()
	}
	return assert.ObjectsAreEqual(configured(flagDefault), configured(s.Default))
}

// TestHelpDefaultsAreTheCodes: `uvm help` lists every variable of
// config.Settings with its default and claims no other; the flags of
// `uvm help serve` and `uvm help run` have those defaults; and
// docs/usage.md's table lists the same variables, flags and defaults.
// What each default means in the code is TestSettingsAreTheCodesDefaults's
// (internal/config) and TestNonServerDefaults's.
func TestHelpDefaultsAreTheCodes(t *testing.T) {
	cleanEnv(t)
	help := helpOf(t)
	_, env, ok := strings.Cut(help, "\nEnvironment")
	require.True(t, ok, help)
	env, _, _ = strings.Cut(env, "\n\n")
	lines := strings.Split(env, "\n")[1:]
	require.Len(t, lines, len(config.Settings), env)
	line := regexp.MustCompile(`^  (UVM_[A-Z_]+) +(.*?)(?: \(default: (.*)\))?$`)
	for i, s := range config.Settings {
		m := line.FindStringSubmatch(lines[i])
		require.NotNil(t, m, "not a variable's line: %q", lines[i])
		assert.Equal(t, s.Env, m[1])
		assert.Equal(t, s.Default, m[3], "%s's default in uvm help", s.Env)
		assert.NotContains(t, m[2], "default", "%s: only the (default: ...) says what the default is: %q", s.Env, lines[i])
	}

	flags := map[string]map[string]string{"serve": flagDefaults(t, helpOf(t, "serve")), "run": flagDefaults(t, helpOf(t, "run"))}
	checked := 0
	for _, s := range config.Settings {
		cmd, name := "serve", s.Flag
		if rest, ok := strings.CutPrefix(s.Flag, "uvm run "); ok {
			cmd, name = "run", rest
		}
		if name == "" {
			continue
		}
		got, ok := flags[cmd][strings.TrimPrefix(name, "--")]
		require.True(t, ok, "%s: no flag %s in uvm help %s", s.Env, name, cmd)
		if s.Env == config.EnvSocket {
			assert.Equal(t, config.DefaultSocketPath(), got, "the socket flag's default is the path the rule gives here")
		} else {
			assert.True(t, meansDefault(t, s, got), "uvm %s %s: default %q, but %s's is %q", cmd, name, got, s.Env, s.Default)
		}
		if s.Server {
			_, inRun := flags["run"][strings.TrimPrefix(name, "--")]
			assert.True(t, inRun, "uvm run takes the server flag %s too", name)
		}
		checked++
	}
	assert.Greater(t, checked, 20)

	doc, err := os.ReadFile(filepath.Join("..", "docs", "usage.md"))
	require.NoError(t, err)
	rows := map[string][]string{}
	var order []string
	for _, l := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(l, "| `UVM_") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		require.Len(t, cells, 4, "a variable's row has four cells: %s", l)
		for i := range cells {
			cells[i] = strings.TrimSpace(strings.ReplaceAll(cells[i], "`", ""))
		}
		rows[cells[0]] = cells
		order = append(order, cells[0])
	}
	var want []string
	for _, s := range config.Settings {
		want = append(want, s.Env)
		r, ok := rows[s.Env]
		if !assert.True(t, ok, "docs/usage.md's table lacks %s", s.Env) {
			continue
		}
		assert.Equal(t, s.Flag, r[1], "%s's flag in docs/usage.md", s.Env)
		assert.Equal(t, s.Default, r[3], "%s's default in docs/usage.md", s.Env)
	}
	assert.ElementsMatch(t, want, order, "docs/usage.md lists the variables uvm help does")
}

// TestNonServerDefaults: the defaults of the variables a server does not
// read, against the code that reads them: the client's UVM_SERVER, the
// socket's rule, and the preload library's (in its C sources too).
func TestNonServerDefaults(t *testing.T) {
	cleanEnv(t)
	c, err := uvm.ConfigFromEnv()
	require.NoError(t, err)
	assert.Equal(t, config.SettingOf(config.EnvServer).Default, c.Server)

	rule := config.SettingOf(config.EnvSocket).Default
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	assert.Equal(t, "/run/user/1000/softuvm/uvm.sock", config.DefaultSocketPath())
	assert.True(t, strings.HasPrefix(rule, "$XDG_RUNTIME_DIR/softuvm/uvm.sock, "), rule)
	os.Unsetenv("XDG_RUNTIME_DIR")
	if os.Geteuid() == 0 {
		assert.Equal(t, "/run/softuvm/uvm.sock", config.DefaultSocketPath())
		assert.Contains(t, rule, "/run/softuvm/uvm.sock for root")
	} else {
		assert.Equal(t, fmt.Sprintf("/tmp/softuvm-%d/uvm.sock", os.Geteuid()), config.DefaultSocketPath())
		assert.Contains(t, rule, "/tmp/softuvm-UID/uvm.sock for others")
	}

	minSize, err := uvm.ParseSize(config.SettingOf(config.EnvMinSize).Default)
	require.NoError(t, err)
	assert.Equal(t, int64(config.DefaultMinSize), minSize)
	preload, err := os.ReadFile(filepath.Join("..", "libuvm", "preload", "preload.c"))
	require.NoError(t, err)
	m := regexp.MustCompile(`#define DEFAULT_MIN_SIZE \(1ul << (\d+)\)`).FindSubmatch(preload)
	require.NotNil(t, m, "preload.c defines DEFAULT_MIN_SIZE")
	shift, _ := strconv.Atoi(string(m[1]))
	assert.Equal(t, minSize, int64(1)<<shift, "preload.c's DEFAULT_MIN_SIZE")

	assert.Equal(t, config.EnvJemalloc, libuvm.EnvJemalloc)
	assert.Equal(t, config.SettingOf(config.EnvJemalloc).Default, libuvm.DefaultJemalloc)
	abi, err := os.ReadFile(filepath.Join("..", "libuvm", "preload", "jemalloc_abi.h"))
	require.NoError(t, err)
	assert.Contains(t, string(abi), `#define JE_LIBRARY "`+libuvm.DefaultJemalloc+`"`, "the library the C side loads")
	// The preload library reports only for "1": unset is "0".
	assert.Contains(t, string(preload), `getenv("UVM_PRELOAD_STATS");`+"\n\tif (!env || strcmp(env, \"1\") != 0)\n\t\treturn;")
	assert.Equal(t, "0", config.SettingOf(config.EnvPreloadStats).Default)
}
