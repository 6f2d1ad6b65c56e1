// crictl: the few crictl commands kind itself runs on a node, for the offline kind node image
// (upstream's cri-tools is not published on the Go module proxy). kind v0.30.0 runs
// `crictl inspecti IMAGE` (kind load: is the image there, under which id and tags) and
// `crictl images` (kind export logs). Also `pods` and `ps` for people debugging a node.
// The endpoint comes from --runtime-endpoint / -r, else /etc/crictl.yaml, else containerd's.
//
// usage: crictl [-r unix:///run/containerd/containerd.sock] images|inspecti IMAGE|pods|ps|version
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

const defaultEndpoint = "unix:///run/containerd/containerd.sock"

func endpointFromConfig() string {
	f, err := os.Open("/etc/crictl.yaml")
	if err != nil {
		return defaultEndpoint
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "runtime-endpoint" {
			return strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return defaultEndpoint
}

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "crictl: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	var endpoint string
	flag.StringVar(&endpoint, "runtime-endpoint", "", "CRI endpoint (default: /etc/crictl.yaml, else "+defaultEndpoint+")")
	flag.StringVar(&endpoint, "r", "", "shorthand for --runtime-endpoint")
	timeout := flag.Duration("timeout", 30*time.Second, "time limit")
	flag.Parse()
	if endpoint == "" {
		endpoint = endpointFromConfig()
	}
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: crictl [-r ENDPOINT] images|inspecti IMAGE|pods|ps|version")
		os.Exit(2)
	}
	logger := klog.Background()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	w := tabwriter.NewWriter(os.Stdout, 0, 8, 3, ' ', 0)
	defer w.Flush()

	switch cmd := flag.Arg(0); cmd {
	case "images", "inspecti":
		is, err := remote.NewRemoteImageService(endpoint, 10*time.Second, nil, &logger)
		if err != nil {
			die("connect to %s: %v", endpoint, err)
		}
		if cmd == "images" {
			imgs, err := is.ListImages(ctx, nil)
			if err != nil {
				die("list images: %v", err)
			}
			fmt.Fprintln(w, "IMAGE\tTAG\tIMAGE ID\tSIZE")
			for _, img := range imgs {
				for _, t := range img.RepoTags {
					i := strings.LastIndex(t, ":")
					fmt.Fprintf(w, "%s\t%s\t%.13s\t%d\n", t[:i], t[i+1:], strings.TrimPrefix(img.Id, "sha256:"), img.Size_)
				}
			}
			return
		}
		if flag.NArg() != 2 {
			die("usage: crictl inspecti IMAGE")
		}
		resp, err := is.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: flag.Arg(1)}, false)
		if err != nil {
			die("image status of %s: %v", flag.Arg(1), err)
		}
		if resp.GetImage() == nil {
			die("no such image %q present", flag.Arg(1))
		}
		img := resp.GetImage()
		// The field names of crictl's JSON (kind reads status.id and status.repoTags).
		status := map[string]any{
			"id": img.GetId(), "repoTags": img.GetRepoTags(), "repoDigests": img.GetRepoDigests(),
			"size": fmt.Sprint(img.GetSize_()), "username": img.GetUsername(), "pinned": img.GetPinned(),
		}
		out, _ := json.MarshalIndent(map[string]any{"status": status, "info": resp.GetInfo()}, "", "  ")
		fmt.Println(string(out))
	case "pods", "ps":
		rs, err := remote.NewRemoteRuntimeService(endpoint, 10*time.Second, nil, &logger)
		if err != nil {
			die("connect to %s: %v", endpoint, err)
		}
		if cmd == "pods" {
			pods, err := rs.ListPodSandbox(ctx, nil)
			if err != nil {
				die("list pod sandboxes: %v", err)
			}
			fmt.Fprintln(w, "POD ID\tSTATE\tNAME\tNAMESPACE")
			for _, p := range pods {
				fmt.Fprintf(w, "%.13s\t%s\t%s\t%s\n", p.Id, p.State, p.GetMetadata().GetName(), p.GetMetadata().GetNamespace())
			}
			return
		}
		cs, err := rs.ListContainers(ctx, nil)
		if err != nil {
			die("list containers: %v", err)
		}
		fmt.Fprintln(w, "CONTAINER\tIMAGE\tSTATE\tNAME\tPOD ID")
		for _, c := range cs {
			fmt.Fprintf(w, "%.13s\t%s\t%s\t%s\t%.13s\n", c.Id, c.GetImage().GetImage(), c.State, c.GetMetadata().GetName(), c.PodSandboxId)
		}
	case "version":
		rs, err := remote.NewRemoteRuntimeService(endpoint, 10*time.Second, nil, &logger)
		if err != nil {
			die("connect to %s: %v", endpoint, err)
		}
		v, err := rs.Version(ctx, "v1")
		if err != nil {
			die("version: %v", err)
		}
		fmt.Printf("RuntimeName:  %s\nRuntimeVersion:  %s\nRuntimeApiVersion:  %s\n", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	default:
		die("unknown command %q (this is the kind node image's small crictl: images, inspecti, pods, ps, version)", cmd)
	}
}
