package policy

import (
	"container/list"
	"sync"
)

// LRU evicts the blocks whose pages arrived on a processor least
// recently: each processor has a list of its blocks, and an arrival moves
// a block to the back. It is NVIDIA's default ("least recently migrated
// in"), not a page-access LRU: a block used in place without moving stays
// where it was in the list.
type LRU struct {
	mu    sync.Mutex
	lists map[Processor]*lruList // guarded by mu
}

type lruList struct {
	order list.List // of *Block, front = least recent
	index map[*Block]*list.Element
}

// NewLRU makes an empty LRU.
func NewLRU() *LRU { return &LRU{lists: map[Processor]*lruList{}} }

func (l *LRU) Name() string { return "lru" }

func (l *LRU) list(p Processor) *lruList {
	ll := l.lists[p]
	if ll == nil {
		ll = &lruList{index: map[*Block]*list.Element{}}
		l.lists[p] = ll
	}
	return ll
}

func (l *LRU) Arrived(b *Block, p Processor, _ int, _ Cause) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ll := l.list(p)
	if e := ll.index[b]; e != nil {
		ll.order.MoveToBack(e)
		return
	}
	ll.index[b] = ll.order.PushBack(b)
}

func (l *LRU) Left(b *Block, p Processor) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ll := l.lists[p]
	if ll == nil {
		return
	}
	if e := ll.index[b]; e != nil {
		ll.order.Remove(e)
		delete(ll.index, b)
	}
}

func (l *LRU) Victims(p Processor, n int, out []*Block) []*Block {
	l.mu.Lock()
	defer l.mu.Unlock()
	ll := l.lists[p]
	if ll == nil {
		return out
	}
	for e := ll.order.Front(); e != nil && n > 0; e, n = e.Next(), n-1 {
		out = append(out, e.Value.(*Block))
	}
	return out
}
