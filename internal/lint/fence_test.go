package lint

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// allowedUnix are the packages that may import golang.org/x/sys/unix: the
// userfaultfd binding and devmem's small memfd/NUMA helper own the kernel
// boundary; everything else goes through them (or the standard library).
var allowedUnix = map[string]bool{
	"github.com/softuvm/softuvm/uffd":                   true,
	"github.com/softuvm/softuvm/devmem/internal/memsys": true,
}

func TestImportFence(t *testing.T) {
	cmd := exec.Command("go", "list", "-json", "github.com/softuvm/softuvm/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	checked := 0
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range p.Imports {
			if imp == "golang.org/x/sys/unix" && !allowedUnix[p.ImportPath] {
				t.Errorf("%s imports golang.org/x/sys/unix: raw system calls belong in uffd or devmem/internal/memsys", p.ImportPath)
			}
		}
	}
	if checked < 4 {
		t.Fatalf("go list found only %d packages", checked)
	}
}
