package redis

import "testing"

func TestPresence(t *testing.T) {
	a, b := testKey(1, 1), testKey(1, 2)
	one := newPresence(1) // a single slot: every key collides
	one.add(a, 10)
	if n, ok := one.size(a); !ok || n != 10 {
		t.Fatalf("size(a) = %d, %v", n, ok)
	}
	one.add(b, 20)
	if _, ok := one.size(a); ok {
		t.Fatal("a survived b taking its slot")
	}
	one.forget(a) // not there: must leave b alone
	if n, ok := one.size(b); !ok || n != 20 {
		t.Fatalf("size(b) after forget(a) = %d, %v", n, ok)
	}
	one.forget(b)
	if _, ok := one.size(b); ok {
		t.Fatal("b remembered after forget")
	}
	one.add(a, 0) // empty objects are never remembered
	if _, ok := one.size(a); ok {
		t.Fatal("empty object remembered")
	}

	if got := len(newPresence(1000).slots); got != 1024 {
		t.Fatalf("1000 slots rounded to %d, want 1024", got)
	}
	off := newPresence(0)
	off.add(a, 10)
	off.forget(a)
	if _, ok := off.size(a); ok {
		t.Fatal("disabled cache remembers")
	}
}
