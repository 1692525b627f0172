package nvmlsampler

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestSysfsPCIAddress(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:18:00.0": "0000:18:00.0",
		"00000001:AB:00.0": "0001:ab:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"":                 "",
		"bogus":            "",
		"zz:18:00.0":       "",
		"0000:../../x":     "",
	} {
		t.Run(fmt.Sprintf("%q", in), func(t *testing.T) {
			got, ok := sysfsPCIAddress(in)
			if got != want || ok != (want != "") {
				t.Errorf("sysfsPCIAddress(%q) = %q, %v; want %q", in, got, ok, want)
			}
		})
	}
}

func TestSysfsNUMANodeMinusOneIsUnknown(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "bus", "pci", "devices", "0000:18:00.0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte("-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, ok := sysfsNUMANode(root, "00000000:18:00.0"); ok {
		t.Errorf("numa_node -1 read as %d", n)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, ok := sysfsNUMANode(root, "00000000:18:00.0"); !ok || n != 1 {
		t.Errorf("numa_node 1 read as %d, %v", n, ok)
	}
}
