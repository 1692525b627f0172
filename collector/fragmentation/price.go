package fragmentation

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// PriceList holds on-demand prices per GPU-hour by NVML model name.
//
// The YAML form (see deploy/prices-example.yaml) is
//
//	date: "2025-03-06"            # when the prices were read (optional)
//	source: https://...           # where they come from (optional)
//	per_gpu_hour:                 # NVML model name: US dollars per GPU-hour
//	  NVIDIA H100 80GB HBM3: 11.06
type PriceList struct {
	Date       string
	Source     string
	PerGPUHour map[string]float64 // NVML model name -> USD per GPU-hour
}

// Field names of the YAML form.
const (
	priceFieldDate   = "date"
	priceFieldSource = "source"
	priceFieldPrices = "per_gpu_hour"
)

const priceFileForm = "want a YAML mapping with keys date, source and per_gpu_hour (NVIDIA model name: US dollars per GPU-hour)"

// MaxPriceFileBytes is the largest price list LoadPriceList reads: a list
// of every GPU model is a few KiB, and a huge file would cost the pod its
// memory before being refused.
const MaxPriceFileBytes = 256 << 10

// LoadPriceList reads and parses the price list file at path; see
// ParsePriceList. Files over MaxPriceFileBytes are refused before parsing.
func LoadPriceList(path string) (*PriceList, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("price list: %w", err)
	}
	defer f.Close()
	tooBig := func(size string) error {
		return fmt.Errorf("price list %s is %s: the limit is %d bytes (%d KiB); a price per GPU model needs only a few KiB", path, size, MaxPriceFileBytes, MaxPriceFileBytes>>10)
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > MaxPriceFileBytes {
		return nil, tooBig(fmt.Sprintf("%d bytes", fi.Size()))
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxPriceFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("price list: %w", err)
	}
	if len(data) > MaxPriceFileBytes {
		return nil, tooBig("larger than that")
	}
	return ParsePriceList(path, data)
}

// ParsePriceList parses a YAML price list; name (usually the file path) is
// used in errors. Parsing is strict: exactly one YAML document, a mapping
// with only the keys date, source and per_gpu_hour, per_gpu_hour a non-empty
// mapping whose keys are model names (unique, also case-insensitively) and
// whose values are YAML numbers (not quoted strings) that are finite and
// >= 0. Errors name the file, the line and the field.
func ParsePriceList(name string, data []byte) (*PriceList, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: empty price list; %s", name, priceFileForm)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, fmt.Errorf("%s: %w", name, err)
	default:
		return nil, fmt.Errorf("%s:%d: a second YAML document; want exactly one", name, extra.Line)
	}

	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, fmt.Errorf("%s: empty price list; %s", name, priceFileForm)
		}
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: top level is %s; %s", name, root.Line, describeNode(root), priceFileForm)
	}

	p := &PriceList{}
	seen := map[string]int{} // top-level key -> line
	var prices *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("%s:%d: top-level key is %s; %s", name, k.Line, describeNode(k), priceFileForm)
		}
		if line, dup := seen[k.Value]; dup {
			return nil, fmt.Errorf("%s:%d: field %s already given on line %d", name, k.Line, k.Value, line)
		}
		seen[k.Value] = k.Line
		switch k.Value {
		case priceFieldDate, priceFieldSource:
			if v.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("%s:%d: field %s is %s; want a string", name, v.Line, k.Value, describeNode(v))
			}
			val := v.Value
			if v.ShortTag() == "!!null" {
				val = ""
			}
			if k.Value == priceFieldDate {
				p.Date = val
			} else {
				p.Source = val
			}
		case priceFieldPrices:
			prices = v
		default:
			return nil, fmt.Errorf("%s:%d: unknown field %q; %s", name, k.Line, k.Value, priceFileForm)
		}
	}
	if prices == nil {
		return nil, fmt.Errorf("%s:%d: missing field %s; %s", name, root.Line, priceFieldPrices, priceFileForm)
	}
	if prices.Kind != yaml.MappingNode || len(prices.Content) == 0 {
		return nil, fmt.Errorf("%s:%d: field %s is %s; want a non-empty mapping of NVIDIA model name to US dollars per GPU-hour", name, prices.Line, priceFieldPrices, describeNode(prices))
	}

	p.PerGPUHour = make(map[string]float64, len(prices.Content)/2)
	lines := make(map[string]int, len(prices.Content)/2) // lower-cased model -> line
	for i := 0; i+1 < len(prices.Content); i += 2 {
		k, v := prices.Content[i], prices.Content[i+1]
		if k.Kind != yaml.ScalarNode || strings.TrimSpace(k.Value) == "" {
			return nil, fmt.Errorf("%s:%d: %s: model name is %s; want the NVIDIA model name as NVML reports it, e.g. \"NVIDIA H100 80GB HBM3\"", name, k.Line, priceFieldPrices, describeNode(k))
		}
		model := strings.TrimSpace(k.Value)
		field := fmt.Sprintf("%s[%q]", priceFieldPrices, model)
		if line, dup := lines[strings.ToLower(model)]; dup {
			return nil, fmt.Errorf("%s:%d: %s: model already priced on line %d (model names are compared case-insensitively)", name, k.Line, field, line)
		}
		lines[strings.ToLower(model)] = k.Line
		price, err := priceValue(v)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %s: %w", name, v.Line, field, err)
		}
		p.PerGPUHour[model] = price
	}
	return p, nil
}

// priceValue decodes one price node: a YAML number, finite and >= 0.
func priceValue(v *yaml.Node) (float64, error) {
	const want = "want a number >= 0 (US dollars per GPU-hour)"
	if v.Kind != yaml.ScalarNode {
		return 0, fmt.Errorf("price is %s; %s", describeNode(v), want)
	}
	if tag := v.ShortTag(); tag != "!!int" && tag != "!!float" {
		hint := ""
		if v.ShortTag() == "!!str" {
			hint = " (write the bare number, without quotes or currency sign)"
		}
		return 0, fmt.Errorf("price %q is %s%s; %s", v.Value, describeNode(v), hint, want)
	}
	var f float64
	if err := v.Decode(&f); err != nil {
		return 0, fmt.Errorf("price %q: %v; %s", v.Value, err, want)
	}
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return 0, fmt.Errorf("price %s is not finite; %s", v.Value, want)
	case f < 0:
		return 0, fmt.Errorf("price %s is negative; %s", v.Value, want)
	}
	return f, nil
}

// describeNode names a node's kind for error messages.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.AliasNode:
		return "an alias (aliases are not supported)"
	case yaml.DocumentNode:
		return "a document"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "empty (null)"
		case "!!str":
			return "a string"
		case "!!bool":
			return "a boolean"
		case "!!int", "!!float":
			return "a number"
		default:
			return "a scalar tagged " + n.ShortTag()
		}
	}
	return "empty"
}

const priceFlagForm = `want comma-separated MODEL=USD_PER_GPU_HOUR, e.g. "NVIDIA H100 80GB HBM3=3.93,NVIDIA A100-SXM4-80GB=1.60"`

// ParsePriceFlag parses prices given on the command line, such as
// "NVIDIA H100 80GB HBM3=3.93,NVIDIA A100-SXM4-80GB=1.60": comma-separated
// MODEL=PRICE entries (model names therefore cannot contain commas), with
// spaces around entries, models and prices ignored. Prices are finite numbers
// >= 0; models must be unique, also case-insensitively. An empty or blank s
// gives an empty map. Wrap the result as &PriceList{Source: "flag",
// PerGPUHour: m} to look models up.
func ParsePriceFlag(s string) (map[string]float64, error) {
	m := map[string]float64{}
	if strings.TrimSpace(s) == "" {
		return m, nil
	}
	for i, e := range strings.Split(s, ",") {
		entry := strings.TrimSpace(e)
		if entry == "" {
			return nil, fmt.Errorf("price entry %d is empty (stray comma?); %s", i+1, priceFlagForm)
		}
		eq := strings.LastIndexByte(entry, '=')
		if eq < 0 {
			return nil, fmt.Errorf("price entry %d (%q): missing \"=PRICE\"; %s", i+1, entry, priceFlagForm)
		}
		model := strings.TrimSpace(entry[:eq])
		text := strings.TrimSpace(entry[eq+1:])
		if model == "" {
			return nil, fmt.Errorf("price entry %d (%q): missing model name before \"=\"; %s", i+1, entry, priceFlagForm)
		}
		price, err := strconv.ParseFloat(text, 64)
		switch {
		case err != nil || math.IsNaN(price) || math.IsInf(price, 0):
			return nil, fmt.Errorf("price entry %d (%q): price %q is not a finite number; %s", i+1, entry, text, priceFlagForm)
		case price < 0:
			return nil, fmt.Errorf("price entry %d (%q): price %v is negative; %s", i+1, entry, price, priceFlagForm)
		}
		for other := range m {
			if strings.EqualFold(other, model) {
				return nil, fmt.Errorf("price entry %d (%q): model %q already priced (model names are compared case-insensitively); want each model once", i+1, entry, other)
			}
		}
		m[model] = price
	}
	return m, nil
}

// Lookup returns the price per GPU-hour of the GPU model NVML reports as
// model. It tries, in order:
//
//  1. the exact name;
//  2. the name compared case-insensitively;
//  3. token containment: names are split into tokens at every character that
//     is not a letter or digit, and a price key matches when each of its
//     tokens is (case-insensitively) a token of model. So "H100 80GB" prices
//     "NVIDIA H100 80GB HBM3", and "A100 80GB" prices
//     "NVIDIA A100-SXM4-80GB" but not "NVIDIA A100-SXM4-40GB". "80 GB" does
//     not match "80GB": tokens are compared whole.
//
// When several keys match at one step, the one with the most tokens (the
// most specific) wins, then the lexicographically smallest key, so the
// result never depends on map order. A nil list prices nothing.
func (p *PriceList) Lookup(model string) (float64, bool) {
	if p == nil || len(p.PerGPUHour) == 0 {
		return 0, false
	}
	if v, ok := p.PerGPUHour[model]; ok {
		return v, true
	}
	best, found := "", false
	for k := range p.PerGPUHour {
		if strings.EqualFold(k, model) && (!found || k < best) {
			best, found = k, true
		}
	}
	if found {
		return p.PerGPUHour[best], true
	}
	bestTokens := 0
	for k := range p.PerGPUHour {
		n := tokensContained(k, model)
		if n == 0 {
			continue
		}
		if n > bestTokens || n == bestTokens && k < best {
			best, bestTokens = k, n
		}
	}
	if bestTokens == 0 {
		return 0, false
	}
	return p.PerGPUHour[best], true
}

// tokensContained returns the number of tokens of key when every one of them
// is a token of model, else 0. It does not allocate.
func tokensContained(key, model string) int {
	n := 0
	for rest := key; ; {
		var tok string
		tok, rest = nextToken(rest)
		if tok == "" {
			return n
		}
		if !hasToken(model, tok) {
			return 0
		}
		n++
	}
}

func hasToken(s, tok string) bool {
	for {
		var t string
		t, s = nextToken(s)
		if t == "" {
			return false
		}
		if strings.EqualFold(t, tok) {
			return true
		}
	}
}

// nextToken returns the first maximal run of letters and digits in s and the
// remainder after it; tok is "" when s has none.
func nextToken(s string) (tok, rest string) {
	start := -1
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		alnum := unicode.IsLetter(r) || unicode.IsDigit(r)
		switch {
		case alnum && start < 0:
			start = i
		case !alnum && start >= 0:
			return s[start:i], s[i:]
		}
		i += size
	}
	if start < 0 {
		return "", ""
	}
	return s[start:], ""
}

// SliceShare is the hourly price of a MIG instance of slices out of
// totalSlices slices of a GPU priced at perGPUHour: the instance pays its
// share of slices. It is 0 unless 0 < slices <= totalSlices.
func SliceShare(perGPUHour float64, slices, totalSlices int) float64 {
	if slices <= 0 || totalSlices <= 0 || slices > totalSlices {
		return 0
	}
	return perGPUHour * float64(slices) / float64(totalSlices)
}

// LoadPrices reads the price file of --idle.price-file (where given) and
// adds the prices of --idle.price (extra) to it; both commands that take
// prices use it: nil where neither gives a price.
func LoadPrices(file string, extra map[string]float64) (*PriceList, error) {
	var list *PriceList
	if file != "" {
		var err error
		if list, err = LoadPriceList(file); err != nil {
			return nil, fmt.Errorf("--idle.price-file: %w", err)
		}
	}
	if len(extra) > 0 {
		if list == nil {
			list = &PriceList{PerGPUHour: map[string]float64{}}
		}
		maps.Copy(list.PerGPUHour, extra)
	}
	return list, nil
}
