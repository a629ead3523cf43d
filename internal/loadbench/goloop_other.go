//go:build !linux

package main

import "errors"

// goloopSupported: the reference loop needs epoll.
const goloopSupported = false

func startGoloops(listen, upstream string, loops int) (func(), error) {
	return nil, errors.New("the reference loop needs Linux (epoll)")
}
