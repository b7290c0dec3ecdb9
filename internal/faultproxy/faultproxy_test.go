package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with the same line and records what it
// received on got.
func echoServer(t *testing.T) (addr string, got <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lines := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					lines <- line
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), lines
}

func start(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// roundTrip sends line on c and returns the reply, or the error that ended
// the wait for it.
func roundTrip(c net.Conn, line string) (string, error) {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(line)); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCutDropsAndRefusesUntilHeal(t *testing.T) {
	addr, _ := echoServer(t)
	p := start(t, addr)
	open := dial(t, p)
	if reply, err := roundTrip(open, "a\n"); err != nil || reply != "a\n" {
		t.Fatalf("before the cut: %q, %v", reply, err)
	}
	p.Cut()
	if _, err := roundTrip(open, "b\n"); err == nil {
		t.Fatal("a connection open at the cut still answers")
	}
	if _, err := roundTrip(dial(t, p), "c\n"); err == nil {
		t.Fatal("a connection made after the cut answers")
	}
	p.Heal()
	if reply, err := roundTrip(dial(t, p), "d\n"); err != nil || reply != "d\n" {
		t.Fatalf("after Heal: %q, %v", reply, err)
	}
}

func TestDropAfterRequestForwardsTheRequestAndLosesTheReply(t *testing.T) {
	addr, got := echoServer(t)
	p := start(t, addr)
	c := dial(t, p)
	p.DropAfterRequest(50 * time.Millisecond)
	if reply, err := roundTrip(c, "applied\n"); err == nil {
		t.Fatalf("the reply %q came through an armed drop", reply)
	}
	select {
	case line := <-got:
		if line != "applied\n" {
			t.Fatalf("the server received %q", line)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the request never reached the server")
	}
	// The drop struck once: the next connection passes.
	if reply, err := roundTrip(dial(t, p), "next\n"); err != nil || reply != "next\n" {
		t.Fatalf("after the drop: %q, %v", reply, err)
	}
}
