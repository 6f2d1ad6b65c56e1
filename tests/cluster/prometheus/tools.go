//go:build tools

// Package tools pins the Prometheus server's main package as this module's dependency (go mod tidy).
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
