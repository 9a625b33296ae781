package workloads

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
)

// The generators write deterministic inputs: the same size and seed give
// the same bytes on every machine (math/rand/v2's PCG is specified).

// syllables spell words: 19 consonants times 5 vowels.
const (
	consonants = "bcdfghjklmnprstvwxz"
	vowels     = "aeiou"
)

// appendWord appends the word of index i: its digits in base 95, each a
// consonant-vowel syllable, at least two of them ("baba" is 0). Distinct
// indices give distinct words.
func appendWord(b []byte, i int) []byte {
	const base = len(consonants) * len(vowels)
	n := 0
	for {
		d := i % base
		b = append(b, consonants[d/len(vowels)], vowels[d%len(vowels)])
		i /= base
		n++
		if i == 0 && n >= 2 {
			return b
		}
	}
}

// wordSource draws word indices: half from a small Zipf-distributed set
// of common words (the first 2,000 indices, as text has), half uniformly
// from a vocabulary of vocab words, so that a hash of the words read has
// about as many keys as the vocabulary.
type wordSource struct {
	rng   *rand.Rand
	zipf  *rand.Zipf
	vocab int
}

func newWordSource(seed uint64, vocab int) *wordSource {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return &wordSource{rng: rng, zipf: rand.NewZipf(rng, 1.2, 1, 1999), vocab: max(vocab, 2000)}
}

func (s *wordSource) next() int {
	if s.rng.IntN(2) == 0 {
		return int(s.zipf.Uint64())
	}
	return s.rng.IntN(s.vocab)
}

// writeLines writes the lines next makes, each appended to the empty
// slice it is given (an empty line writes nothing), until size bytes.
func writeLines(path string, size int64, next func(line []byte) []byte) error {
	return writeFile(path, func(w *bufio.Writer) error {
		var line []byte
		for n := int64(0); n < size; n += int64(len(line)) {
			line = next(line[:0])
			if _, err := w.Write(line); err != nil {
				return err
			}
		}
		return nil
	})
}

// writeFile creates path and calls fill with a buffered writer to it.
func writeFile(path string, fill func(w *bufio.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	err = fill(w)
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// writeText writes lines of 4 to 12 words until size bytes: the words of
// a vocabulary of size/vocabDivisor words (a word and its separator take
// about 7 bytes, so each word of the vocabulary appears about
// vocabDivisor/14 times, half its appearances being the common words).
func writeText(path string, size int64, seed uint64, vocabDivisor int64) error {
	src := newWordSource(seed, int(size/vocabDivisor))
	return writeLines(path, size, func(line []byte) []byte {
		for k := 4 + src.rng.IntN(9); k > 0; k-- {
			line = appendWord(line, src.next())
			line = append(line, ' ')
		}
		line[len(line)-1] = '\n'
		return line
	})
}

// WriteLog writes deterministic, compressible web-server log lines until
// size bytes: what the compressors compress (repeated text with
// variation, about 7:1 for gzip). The same size and seed give the same
// bytes.
func WriteLog(path string, size int64, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	paths := []string{"/api/v1/items", "/api/v1/users", "/static/app.js", "/health", "/api/v2/orders"}
	i := 0
	return writeLines(path, size, func(line []byte) []byte {
		status := 200
		if rng.IntN(20) == 0 {
			status = 404
		}
		line = fmt.Appendf(line, "2024-05-%02d %06d INFO req=%08d path=%s/%d status=%d bytes=%d\n",
			1+i/3000000%28, i%1000000, i, paths[i%len(paths)], rng.IntN(1000), status, rng.IntN(100000))
		i++
		return line
	})
}

// writeDAG writes the edges of a random acyclic graph, one "from to"
// pair of node names per line, until size bytes: what tsort orders. The
// nodes are size/20 names; each edge goes from a lower index to a higher
// one, so the graph has no cycle, and the names are the words of
// scrambled indices, so that their order says nothing of the graph's.
func writeDAG(path string, size int64, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, seed+7))
	nodes := int(max(size/20, 100))
	perm := rng.Perm(nodes)
	return writeLines(path, size, func(line []byte) []byte {
		a, b := rng.IntN(nodes), rng.IntN(nodes)
		if a == b {
			return line
		}
		if a > b {
			a, b = b, a
		}
		line = appendWord(line, perm[a])
		line = append(line, ' ')
		line = appendWord(line, perm[b])
		return append(line, '\n')
	})
}

// writeRowsCSV writes rows "id,grp,name,val" until size bytes: what
// sqlite3 imports. Names repeat (a vocabulary of a tenth of the rows).
func writeRowsCSV(path string, size int64, seed uint64) error {
	src := newWordSource(seed, int(size/300))
	id := 0
	return writeLines(path, size, func(line []byte) []byte {
		id++
		line = strconv.AppendInt(line, int64(id), 10)
		line = append(line, ',')
		line = strconv.AppendInt(line, int64(src.rng.IntN(1000)), 10)
		line = append(line, ',')
		line = appendWord(line, src.next())
		line = append(line, '-')
		line = appendWord(line, src.next())
		line = append(line, ',')
		line = strconv.AppendInt(line, int64(src.rng.IntN(1_000_000)), 10)
		return append(line, '\n')
	})
}

// writeJSONRecords writes one JSON array of objects until about size
// bytes: what jq groups.
func writeJSONRecords(path string, size int64, seed uint64) error {
	src := newWordSource(seed, int(size/200))
	return writeFile(path, func(w *bufio.Writer) error {
		if err := w.WriteByte('['); err != nil {
			return err
		}
		var rec []byte
		for id, n := 0, int64(1); n < size; id, n = id+1, n+int64(len(rec)) {
			rec = rec[:0]
			if id > 0 {
				rec = append(rec, ",\n"...)
			}
			rec = fmt.Appendf(rec, `{"id":%d,"tag":"t%02d","score":%d,"user":"`, id, src.rng.IntN(64), src.rng.IntN(10000))
			rec = appendWord(rec, src.next())
			rec = append(rec, `","words":[`...)
			for k := src.rng.IntN(5); k >= 0; k-- {
				rec = append(rec, '"')
				rec = appendWord(rec, src.next())
				rec = append(rec, '"')
				if k > 0 {
					rec = append(rec, ',')
				}
			}
			rec = append(rec, "]}"...)
			if _, err := w.Write(rec); err != nil {
				return err
			}
		}
		_, err := w.WriteString("]\n")
		return err
	})
}
