package server

import "strings"

// SetBeforeSubmit installs a hook that runs inside a submit, after its key
// is marked in flight and before the store is called. Tests only.
func SetBeforeSubmit(cfg *Config, f func()) { cfg.beforeSubmit = f }

// RouteTable lists the served routes as method and path template, with
// Echo's :param written as OpenAPI's {param}.
func (s *Server) RouteTable() [][2]string {
	var out [][2]string
	for _, r := range s.echo.Routes() {
		out = append(out, [2]string{r.Method, openAPIPath(r.Path)})
	}
	return out
}

func openAPIPath(p string) string {
	parts := strings.Split(p, "/")
	for i, seg := range parts {
		if name, ok := strings.CutPrefix(seg, ":"); ok {
			parts[i] = "{" + name + "}"
		}
	}
	return strings.Join(parts, "/")
}

// AuthFailureBuckets is how many client addresses the 401 limiter holds a
// bucket for.
func (s *Server) AuthFailureBuckets() int {
	if s.authFailures == nil {
		return 0
	}
	s.authFailures.mu.Lock()
	defer s.authFailures.mu.Unlock()
	return len(s.authFailures.buckets)
}
