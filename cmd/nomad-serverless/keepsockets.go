package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nomad-serverless/nomad-serverless/controlplane"
)

func runKeepSockets(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "keep-sockets", `Usage: nomad-serverless keep-sockets -socket <path> -listen <address> [-https-listen <address>] [-internal-listen <address>]

Binds the gateway's listening sockets and hands them to serve (serve
-sockets <path>) at each of its starts, so they outlive a crash of serve:
connections made while serve is down wait in the kernel's backlog for the
serve Nomad restarts. The install job runs it as a prestart sidecar task.

`)
	k := controlplane.SocketKeeper{Listen: map[string]string{}}
	var listen, httpsListen, internalListen string
	fs.StringVar(&k.Path, "socket", "", "unix socket `path` serve takes the sockets from")
	fs.StringVar(&listen, "listen", "", "`address` of the gateway, as serve's -listen")
	fs.StringVar(&httpsListen, "https-listen", "", "`address` of the gateway's HTTPS, as serve's -listen host with its -https-port")
	fs.StringVar(&internalListen, "internal-listen", "", "`address` of the gateway's internal listener, as serve's -internal-listen")
	owner := fs.Int("owner", -1, "`uid` of the user serve runs as, when it is not the keeper's: the socket is given to it, mode 0600")
	if _, err := parseFlagsAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if k.Path == "" || listen == "" {
		fmt.Fprintln(e.stderr, "nomad-serverless keep-sockets: -socket and -listen are required")
		return exitUsage
	}
	k.Listen[controlplane.SocketGateway] = listen
	if httpsListen != "" {
		k.Listen[controlplane.SocketHTTPS] = httpsListen
	}
	if internalListen != "" {
		k.Listen[controlplane.SocketInternal] = internalListen
	}
	if *owner >= 0 {
		k.Owner = owner
	}
	k.Logger = slog.New(slog.NewTextHandler(e.stderr, nil))
	if err := k.Run(ctx); err != nil {
		return errorLine(e, "keep-sockets", err)
	}
	return exitOK
}
