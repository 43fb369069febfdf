package deploy

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"kvtier/config"
	"kvtier/internal/servetest"
)

// instruction is one Dockerfile instruction: its keyword in upper case and
// the rest of its (continued) line.
type instruction struct {
	line int
	cmd  string
	args string
}

// stage is one FROM and the instructions under it.
type stage struct {
	base, name string
	ins        []instruction
}

// parseDockerfile splits a Dockerfile into stages of instructions, joining
// lines continued with a backslash and dropping comments as Docker does.
// It knows only what the checks below need, not the whole syntax.
func parseDockerfile(text string) ([]stage, map[string]string, error) {
	var stages []stage
	globalArgs := map[string]string{}
	var cur strings.Builder
	start := 0
	flush := func(lineNo int) error {
		s := strings.TrimSpace(cur.String())
		cur.Reset()
		if s == "" {
			return nil
		}
		cmd, args, _ := strings.Cut(s, " ")
		in := instruction{line: lineNo, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			} else if len(f) != 1 {
				return fmt.Errorf("line %d: FROM %s", lineNo, in.args)
			}
			stages = append(stages, st)
			return nil
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				return fmt.Errorf("line %d: %s before the first FROM", lineNo, in.cmd)
			}
			k, v, _ := strings.Cut(in.args, "=")
			globalArgs[k] = v
			return nil
		}
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		return nil
	}
	for i, line := range strings.Split(text, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if body, ok := strings.CutSuffix(t, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(t)
		if err := flush(start); err != nil {
			return nil, nil, err
		}
	}
	return stages, globalArgs, flush(start)
}

// execForm decodes an instruction's JSON (exec) form.
func execForm(t *testing.T, in instruction) []string {
	t.Helper()
	var argv []string
	if err := json.Unmarshal([]byte(in.args), &argv); err != nil || len(argv) == 0 {
		t.Fatalf("line %d: %s %s: want the exec form [\"...\"]: %v", in.line, in.cmd, in.args, err)
	}
	return argv
}

func find(st stage, cmd string) []instruction {
	var out []instruction
	for _, in := range st.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// TestDockerfile checks deploy/Dockerfile without a Docker engine: the
// default target is a distroless or scratch image running a static binary
// as a non-root user; its entry point is where the binary was copied; the
// HEALTHCHECK runs a subcommand and flags the binary really has, and it
// passes against a running daemon; its environment is a valid
// configuration; every file it copies from the tree exists.
func TestDockerfile(t *testing.T) {
	text, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages, args, err := parseDockerfile(string(text))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]stage{}
	for _, s := range stages {
		byName[s.name] = s
	}
	final := stages[len(stages)-1] // the default target
	if final.base != "scratch" && !strings.HasPrefix(final.base, "gcr.io/distroless/static") {
		t.Errorf("final stage FROM %s: want scratch or distroless/static", final.base)
	}

	// Non-root: the last USER of the final stage.
	users := find(final, "USER")
	if len(users) == 0 {
		t.Fatal("final stage has no USER")
	}
	user, _, _ := strings.Cut(users[len(users)-1].args, ":")
	if user == "root" || user == "0" || user == "" {
		t.Errorf("USER %s: want a non-root user", users[len(users)-1].args)
	}

	// The binary: built static in the build stage, copied to the entry point.
	build, ok := byName["build"]
	if !ok {
		t.Fatal("no stage named build")
	}
	var buildCmd string
	for _, in := range find(build, "RUN") {
		if strings.Contains(in.args, "go build") {
			buildCmd = in.args
		}
	}
	if !strings.Contains(buildCmd, "CGO_ENABLED=0") || !strings.Contains(buildCmd, "./cmd/kvtier") {
		t.Errorf("build stage: RUN %q, want CGO_ENABLED=0 ... go build ... ./cmd/kvtier", buildCmd)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mustRead(t, "../go.mod"))
	if args["GO_VERSION"] != string(goVersion[1]) || !strings.HasPrefix(build.base, "golang:${GO_VERSION}") {
		t.Errorf("build image %s with GO_VERSION=%s, go.mod says go %s", build.base, args["GO_VERSION"], goVersion[1])
	}
	entry := execForm(t, find(final, "ENTRYPOINT")[0])
	copied := false
	for _, in := range find(final, "COPY") {
		f := strings.Fields(in.args)
		copied = copied || (strings.HasPrefix(in.args, "--from=build ") && f[len(f)-1] == entry[0])
	}
	if !copied {
		t.Errorf("ENTRYPOINT %s: no COPY --from=build puts the binary there", entry[0])
	}
	for _, st := range stages {
		for _, in := range find(st, "COPY") {
			if strings.Contains(in.args, "--from=") {
				continue
			}
			f := strings.Fields(in.args)
			for _, src := range f[:len(f)-1] {
				if _, err := os.Stat(filepath.Join("..", src)); err != nil {
					t.Errorf("line %d: COPY %s: %v", in.line, src, err)
				}
			}
		}
	}

	// The default command and the environment, read by the real binary
	// and the real configuration loader.
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmdArgs := execForm(t, find(final, "CMD")[0])
	if out, err := exec.Command(bin, append(cmdArgs, "--help")...).CombinedOutput(); err != nil {
		t.Errorf("kvtier %v --help: %v\n%s", cmdArgs, err, out)
	}
	var environ []string
	for _, in := range find(final, "ENV") {
		environ = append(environ, strings.Fields(strings.ReplaceAll(in.args, `\`, ""))...)
	}
	if _, err := config.FromEnv(environ); err != nil {
		t.Errorf("ENV %v: %v", environ, err)
	}

	checkHealthcheck(t, final, entry[0], bin)
}

// checkHealthcheck checks the HEALTHCHECK names the image's binary, a
// subcommand and flags it accepts, and the daemon's default admin address;
// then runs it, pointed at a real daemon, and expects it to pass, and at
// a closed port, and expects it to fail.
func checkHealthcheck(t *testing.T, final stage, entry, bin string) {
	t.Helper()
	hcs := find(final, "HEALTHCHECK")
	if len(hcs) != 1 {
		t.Fatalf("final stage has %d HEALTHCHECKs", len(hcs))
	}
	_, rest, ok := strings.Cut(hcs[0].args, "CMD ")
	if !ok {
		t.Fatalf("HEALTHCHECK %s: no CMD", hcs[0].args)
	}
	argv := execForm(t, instruction{line: hcs[0].line, cmd: "HEALTHCHECK CMD", args: rest})
	if argv[0] != entry {
		t.Errorf("HEALTHCHECK runs %s, the binary is %s", argv[0], entry)
	}
	help, err := exec.Command(bin, argv[1], "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(help), "kvtier "+argv[1]) {
		t.Fatalf("kvtier %s --help: %v\n%s", argv[1], err, help)
	}
	var target string
	for i, a := range argv[2:] {
		if strings.HasPrefix(a, "--") && !regexp.MustCompile(`(?m)^\s+`+regexp.QuoteMeta(a)+`\b`).Match(help) {
			t.Errorf("HEALTHCHECK flag %s is not in kvtier %s --help", a, argv[1])
		}
		if a == "--url" {
			target = argv[2+i+1]
		}
	}
	u, err := url.Parse(target)
	if err != nil || u.Host != config.Default().AdminAddr {
		t.Errorf("HEALTHCHECK --url %s: want the daemon's default admin_addr %s", target, config.Default().AdminAddr)
	}

	d := servetest.Start(t, t.TempDir(), "max_local_cpu_size: 0.0625")
	run := func(host string) error {
		a := append([]string{}, argv[1:]...)
		for i := range a {
			if a[i] == target {
				a[i] = strings.Replace(target, u.Host, host, 1)
			}
		}
		out, err := exec.Command(bin, a...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := run(strings.TrimPrefix(d.Admin, "http://")); err != nil {
		t.Errorf("HEALTHCHECK against a running daemon: %v", err)
	}
	d.Kill()
	if err := run(strings.TrimPrefix(d.Admin, "http://")); err == nil {
		t.Error("HEALTHCHECK passed against a killed daemon")
	}
}

// TestDockerignore checks the build context's ignore file leaves in every
// package the binary is built from, and the Python package.
func TestDockerignore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "kvtier/cmd/kvtier").Output()
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum", "python"}
	for _, pkg := range strings.Fields(string(out)) {
		if rest, ok := strings.CutPrefix(pkg, "kvtier/"); ok {
			needed = append(needed, rest)
		}
	}
	for line := range strings.Lines(string(mustRead(t, "Dockerfile.dockerignore"))) {
		pat := strings.TrimSpace(line)
		if pat == "" || pat[0] == '#' {
			continue
		}
		for _, path := range needed {
			for p := path; p != "."; p = filepath.Dir(p) {
				if ok, _ := filepath.Match(pat, p); ok {
					t.Errorf("Dockerfile.dockerignore: %q leaves out %s, which the image needs", pat, path)
				}
			}
		}
	}
	if len(needed) < 10 {
		t.Fatalf("only %d packages found", len(needed))
	}
}

// TestDockerBuildIsStatic runs the Dockerfile's own `go build` line here
// and checks the binary is static: no program interpreter and no shared
// libraries, so it runs on distroless/static (or scratch), which has no
// libc.
func TestDockerBuildIsStatic(t *testing.T) {
	stages, _, err := parseDockerfile(string(mustRead(t, "Dockerfile")))
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, st := range stages {
		for _, in := range find(st, "RUN") {
			if strings.Contains(in.args, "go build") {
				line = in.args
			}
		}
	}
	// VAR=value words, then go build's arguments with -o pointed here.
	words := shellWords(line)
	var env []string
	for len(words) > 0 && strings.Contains(words[0], "=") {
		env, words = append(env, words[0]), words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "build" {
		t.Fatalf("RUN %q: want VAR=value ... go build ...", line)
	}
	out := filepath.Join(t.TempDir(), "kvtier")
	args := slices.Clone(words[1:])
	for i := range args {
		if args[i] == "-o" && i+1 < len(args) {
			args[i+1] = out
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), env...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %v: %v\n%s", args, err, msg)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the image's binary has a %v program header: it is not static", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the image's binary needs %v", libs)
	}
	if help, err := exec.Command(out, "healthcheck", "--help").CombinedOutput(); err != nil {
		t.Errorf("the static binary: %v\n%s", err, help)
	}
}

// shellWords splits a command line into words as sh does for the simple
// lines a Dockerfile's RUN holds: blanks separate words, double or single
// quotes group blanks into one and are removed. It stops at the first
// "&&", ";" or "|", since only the first command is wanted.
func shellWords(line string) []string {
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	for i, word := range words {
		if word == "&&" || word == ";" || word == "|" {
			return words[:i]
		}
	}
	return words
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestShellWords(t *testing.T) {
	got := shellWords(`CGO_ENABLED=0 go build -ldflags="-s -w" -o '/out/a b' ./cmd/kvtier && echo x`)
	want := []string{"CGO_ENABLED=0", "go", "build", "-ldflags=-s -w", "-o", "/out/a b", "./cmd/kvtier"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
