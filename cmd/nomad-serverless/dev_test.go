package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// What dev does is tested in package dev; these test its flags.

func TestDevFlags(t *testing.T) {
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	if code := run(context.Background(), e, []string{"dev", "extra"}); code != exitUsage || !strings.Contains(errb.String(), "unexpected argument") {
		t.Errorf("dev extra: exit %d, %s", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), e, []string{"dev", "-h"}); code != exitOK || !strings.Contains(errb.String(), "-demo") || !strings.Contains(errb.String(), "-or-demo") || !strings.Contains(errb.String(), "-deploy file") {
		t.Errorf("dev -h: exit %d, %s", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), e, []string{"dev", "-deploy", filepath.Join(t.TempDir(), "nope.hcl")}); code != exitUsage || !strings.Contains(errb.String(), "-deploy: stat ") {
		t.Errorf("dev -deploy of a missing file: exit %d, %s", code, errb.String())
	}
}

func TestDevNodesFlag(t *testing.T) {
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	if code := run(context.Background(), e, []string{"dev", "-nodes", "-1"}); code != exitUsage || !strings.Contains(errb.String(), "-nodes -1: want 0 (one dev agent) or more") {
		t.Errorf("dev -nodes -1: exit %d, %s", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), e, []string{"dev", "-h"}); code != exitOK || !strings.Contains(errb.String(), "-nodes N") {
		t.Errorf("dev -h does not document -nodes: exit %d, %s", code, errb.String())
	}
}
