package docscheck

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// root is the repository root, seen from this package's directory.
var root = filepath.Join("..", "..")

// manual lists the files that make up the manual, relative to root: the
// README and every page under docs/.
func manual(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no pages under docs/")
	}
	files := []string{filepath.Join(root, "README.md")}
	return append(files, pages...)
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// normalize makes text comparable whatever its line breaks: runs of white
// space become one space, and ** emphasis markers are dropped, so a bold
// lead-in may become plain text without changing the words.
func normalize(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "**", "")), " ")
}

// promises reads docs/promises.txt: one phrase a line, # comments and blank
// lines ignored.
func promises(t *testing.T) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(read(t, filepath.Join(root, "docs", "promises.txt"))))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, normalize(line))
	}
	return out
}

// Each promise the documentation makes is written exactly once: a phrase
// found nowhere was dropped or reworded without updating promises.txt, and
// one found twice is a promise stated in two places, which drift apart.
func TestEveryPromiseIsWrittenExactlyOnce(t *testing.T) {
	files := manual(t)
	texts := make(map[string]string, len(files))
	for _, f := range files {
		texts[f] = normalize(read(t, f))
	}
	phrases := promises(t)
	if len(phrases) < 300 {
		t.Fatalf("docs/promises.txt lists %d phrases; expected the full list", len(phrases))
	}
	seen := map[string]bool{}
	for _, p := range phrases {
		if len(strings.Fields(p)) < 6 {
			t.Errorf("phrase %q has fewer than six words: too short to find one promise", p)
		}
		if seen[p] {
			t.Errorf("phrase %q is listed twice in docs/promises.txt", p)
		}
		seen[p] = true
		var where []string
		for _, f := range files {
			for range strings.Count(texts[f], p) {
				where = append(where, rel(f))
			}
		}
		switch len(where) {
		case 1:
		case 0:
			t.Errorf("promise not written anywhere in README.md or docs/*.md: %q", p)
		default:
			t.Errorf("promise written %d times (%s): %q", len(where), strings.Join(where, ", "), p)
		}
	}
}

func rel(path string) string {
	r, err := filepath.Rel(root, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}

var codeValue = regexp.MustCompile(`^RUN-E[0-9]{3}$`)

// errorCodes returns every error code the root package declares as a
// string constant ("RUN-E001" …), whichever file declares it.
func errorCodes(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, root, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, pkg := range pkgs {
		for _, file := range pkg.Files {
			ast.Inspect(file, func(n ast.Node) bool {
				vs, ok := n.(*ast.ValueSpec)
				if !ok {
					return true
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					s, err := strconv.Unquote(lit.Value)
					if err == nil && codeValue.MatchString(s) {
						codes = append(codes, s)
					}
				}
				return true
			})
		}
	}
	sort.Strings(codes)
	return codes
}

// tableRowCodes returns, for each markdown table row whose first cell is an
// error code, that code, as often as it has a row.
func tableRowCodes(text string) map[string]int {
	rows := map[string]int{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		first := strings.Trim(strings.TrimSpace(cells[0]), "`*")
		if codeValue.MatchString(first) {
			rows[first]++
		}
	}
	return rows
}

// Every error code the package declares has exactly one row in
// docs/errors.md, and the table has no row for a code that does not exist.
func TestEveryErrorCodeHasOneRow(t *testing.T) {
	codes := errorCodes(t)
	if len(codes) < 13 {
		t.Fatalf("found %d error codes in the root package (%v); the parser missed some", len(codes), codes)
	}
	rows := tableRowCodes(read(t, filepath.Join(root, "docs", "errors.md")))
	declared := map[string]bool{}
	for _, c := range codes {
		declared[c] = true
		if rows[c] != 1 {
			t.Errorf("%s has %d rows in docs/errors.md, want 1", c, rows[c])
		}
	}
	for c := range rows {
		if !declared[c] {
			t.Errorf("docs/errors.md has a row for %s, which the package does not declare", c)
		}
	}
}

var (
	fence      = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```[^\\n]*$")
	inlineCode = regexp.MustCompile("`[^`\\n]*`")
	mdLink     = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	heading    = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
)

// links returns the targets of the inline links of a markdown text, outside
// code blocks and code spans.
func links(text string) []string {
	text = fence.ReplaceAllString(text, "")
	text = inlineCode.ReplaceAllString(text, "")
	var out []string
	for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// anchors returns the anchors GitHub gives the headings of a markdown text:
// lower case, punctuation dropped, spaces as hyphens, and -1, -2 … after
// repeats.
func anchors(text string) map[string]bool {
	text = fence.ReplaceAllString(text, "")
	out := map[string]bool{}
	count := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		slug := slugify(m[1])
		if n := count[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		count[slug]++
	}
	return out
}

func slugify(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_',
			r >= 'a' && r <= 'z', r >= '0' && r <= '9', r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Every relative link of the manual and the changelog reaches a file that
// exists, and every #anchor a heading of its page.
func TestRelativeLinksResolve(t *testing.T) {
	files := append(manual(t), filepath.Join(root, "CHANGELOG.md"))
	checked := 0
	for _, f := range files {
		for _, target := range links(read(t, f)) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s links to %s, which does not exist", rel(f), target)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s links to %s: an anchor into a file that is not markdown", rel(f), target)
				continue
			}
			if !anchors(read(t, dest))[anchor] {
				t.Errorf("%s links to %s, but %s has no heading with anchor #%s", rel(f), target, rel(dest), anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the link pattern is broken")
	}
}
