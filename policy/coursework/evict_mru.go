package coursework

import (
	"fmt"
	"sync"

	"github.com/softuvm/softuvm/policy"
)

// MRU evicts the block whose pages arrived on the processor most
// recently: the opposite of the default LRU, good for a loop over a
// working set larger than memory, where the oldest block is the next one
// needed.
type MRU struct {
	mu    sync.Mutex
	order map[policy.Processor][]*policy.Block // most recent last; guarded by mu
}

func init() {
	err := policy.RegisterEviction("mru", func(arg string) (policy.Eviction, error) {
		if arg != "" {
			return nil, fmt.Errorf("eviction policy \"mru:%s\": mru takes no argument", arg)
		}
		return &MRU{order: map[policy.Processor][]*policy.Block{}}, nil
	})
	if err != nil {
		panic(err) // a name taken twice is a programming error
	}
}

func (m *MRU) Name() string { return "mru" }

func (m *MRU) Arrived(b *policy.Block, p policy.Processor, _ int, _ policy.Cause) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.order[p] = append(remove(m.order[p], b), b)
}

func (m *MRU) Left(b *policy.Block, p policy.Processor) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.order[p] = remove(m.order[p], b)
}

func (m *MRU) Victims(p policy.Processor, n int, out []*policy.Block) []*policy.Block {
	m.mu.Lock()
	defer m.mu.Unlock()
	list := m.order[p]
	for i := len(list) - 1; i >= 0 && n > 0; i, n = i-1, n-1 {
		out = append(out, list[i])
	}
	return out
}

func remove(list []*policy.Block, b *policy.Block) []*policy.Block {
	for i, x := range list {
		if x == b {
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}
