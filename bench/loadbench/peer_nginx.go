package main

import (
	"fmt"
	"path/filepath"
)

// nginxPeer is nginx as a reverse proxy tuned for keep-alive to the app:
// an upstream keepalive pool of 64, HTTP/1.1 upstream with the Connection
// header cleared (without both nginx opens a connection per request), two
// workers (one a core).
func nginxPeer() peerKind {
	return peerKind{
		Name:       "nginx",
		Bin:        "nginx",
		Package:    "nginx",
		ConfigFile: "nginx.conf",
		Config:     nginxConfig,
		// -p and -e keep nginx out of /var/log and /run (1.22 has -e);
		// daemon off keeps it in the foreground.
		Args: func(dir, path string) []string {
			return []string{"-p", dir + "/", "-c", path, "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;"}
		},
	}
}

// nginxConfig renders nginx's configuration. Every path it names is in
// dir. keepalive_requests is raised on both sides: at the default (1000)
// nginx closes a kept-alive connection every thousand requests, which our
// proxies do not.
func nginxConfig(dir, listen, upstream string) string {
	return fmt.Sprintf(`# Written by loadbench: a peer proxy in front of %[3]s.
worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;

events {
	worker_connections 4096;
}

http {
	access_log off;
	client_body_temp_path %[1]s/client_body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	keepalive_requests 1000000;
	keepalive_timeout 60s;

	upstream app {
		server %[3]s;
		keepalive 64;
		keepalive_requests 1000000;
		keepalive_timeout 60s;
	}

	server {
		listen %[2]s;
		location / {
			proxy_pass http://app;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header Host $http_host;
		}
	}
}
`, dir, listen, upstream)
}
