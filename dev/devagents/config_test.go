package devagents

import (
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// hclAttrs parses an agent configuration and flattens it into
// "block.label.attr" -> value, as the agents would read it.
func hclAttrs(t *testing.T, src string) map[string]string {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(src), "agent.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("does not parse: %v\n%s", diags, src)
	}
	out := map[string]string{}
	var walk func(string, *hclsyntax.Body)
	walk = func(prefix string, b *hclsyntax.Body) {
		for name, a := range b.Attributes {
			v, d := a.Expr.Value(nil)
			if d.HasErrors() {
				t.Fatalf("%s%s: %v", prefix, name, d)
			}
			switch v.Type().FriendlyName() {
			case "string":
				out[prefix+name] = v.AsString()
			case "number":
				out[prefix+name] = v.AsBigFloat().Text('f', -1)
			case "bool":
				out[prefix+name] = strconv.FormatBool(v.True())
			}
		}
		for _, blk := range b.Blocks {
			walk(prefix+strings.Join(append([]string{blk.Type}, blk.Labels...), ".")+".", blk.Body)
		}
	}
	walk("", f.Body.(*hclsyntax.Body))
	return out
}

func TestConfigs(t *testing.T) {
	p := Ports{ConsulHTTP: 18500, ConsulDNS: 18600, ConsulServer: 18300, ConsulSerfLAN: 18301, ConsulSerfWAN: 18302, ConsulGRPC: 18502,
		NomadHTTP: 14646, NomadRPC: 14647, NomadSerf: 14648}
	check := func(name string, got map[string]string, want map[string]string, absent ...string) {
		t.Helper()
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", name, k, got[k], v)
			}
		}
		for _, k := range absent {
			if _, ok := got[k]; ok {
				t.Errorf("%s: %s is set", name, k)
			}
		}
	}
	check("consul", hclAttrs(t, ConsulConfig(p, ConfigOptions{})), map[string]string{
		"bind_addr": "127.0.0.1", "client_addr": "127.0.0.1", "advertise_addr": "127.0.0.1", "log_level": "INFO",
		"ports.http": "18500", "ports.dns": "18600", "ports.server": "18300", "ports.serf_lan": "18301",
		"ports.serf_wan": "18302", "ports.grpc": "18502", "ports.grpc_tls": "-1", "ui_config.enabled": "true",
	}, "acl.enabled")
	check("nomad", hclAttrs(t, NomadConfig(p, "/tmp/x y/nomad-data", ConfigOptions{LogLevel: "DEBUG"})), map[string]string{
		"data_dir": "/tmp/x y/nomad-data", "bind_addr": "127.0.0.1", "log_level": "DEBUG",
		"ports.http": "14646", "ports.rpc": "14647", "ports.serf": "14648",
		"advertise.http": "127.0.0.1", "advertise.rpc": "127.0.0.1", "advertise.serf": "127.0.0.1",
		"consul.address": "127.0.0.1:18500", "consul.grpc_address": "127.0.0.1:18502",
		"plugin.raw_exec.config.enabled": "true", "client.gc_max_allocs": "1000",
	}, "acl.enabled", "consul.token")

	acl := &ACL{ConsulManagementToken: "c0ffee00-0000-4000-8000-000000000001"}
	check("consul+acl", hclAttrs(t, ConsulConfig(p, ConfigOptions{ACL: acl})), map[string]string{
		"acl.enabled": "true", "acl.default_policy": "deny",
		"acl.tokens.initial_management": acl.ConsulManagementToken, "acl.tokens.agent": acl.ConsulManagementToken,
	})
	check("nomad+acl", hclAttrs(t, NomadConfig(p, "/tmp/d", ConfigOptions{ACL: acl})), map[string]string{
		"acl.enabled": "true", "consul.token": acl.ConsulManagementToken,
	})
	check("nomad+host volumes", hclAttrs(t, NomadConfig(p, "/tmp/d", ConfigOptions{HostVolumes: map[string]string{"data": "/srv/data", "logs": "/srv/logs"}})), map[string]string{
		"client.host_volume.data.path": "/srv/data", "client.host_volume.logs.path": "/srv/logs",
	})
}
