package engine

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Lease owners. DefaultOwner names a process <host>/<pid>/<random>, where
// <host> is the host name followed, where the system can tell, by "~" and
// a digest of the kernel's boot id and the process's pid namespace. Two
// processes with the same <host> see the same processes: one of them can
// tell that the other no longer exists (ownerGone), and take its runs over
// at once instead of waiting for its leases to lapse. A process that died
// cannot write, nor call a tool, so nothing is lost by not waiting; a pid
// reused by another process only makes the wait happen.

// DefaultOwner names this process as a lease owner: host, pid and a
// random part, so that a restarted process with the same pid is another
// owner.
func DefaultOwner() string { return ownerOf(ownerHost()) }

// NamedOwner names this process as a lease owner under name, the
// operator's name for the replica (a pod's, say), instead of its host:
// <name>/<pid>/<random>. "/" and "~" in name become "_". Another process
// never tells from a named owner's pid that it is gone, so the runs of a
// named replica that died are taken over once their leases lapse.
func NamedOwner(name string) string { return ownerOf(ownerName.Replace(name)) }

// ownerOf is this process as a lease owner under first: first, pid and a
// random part.
func ownerOf(first string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return fmt.Sprintf("%s/%d/%s", first, os.Getpid(), hex.EncodeToString(b))
}

// ownerName keeps an owner's first part free of the separators.
var ownerName = strings.NewReplacer("/", "_", "~", "_")

// ownerHost is the <host> of this process's default owner.
var ownerHost = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	host = ownerName.Replace(host)
	if scope := processScope(); scope != "" {
		return host + "~" + scope
	}
	return host
})

// localOwnerPrefix is the <host> of owners whose liveness this process can
// tell; "" if it can tell none.
func localOwnerPrefix() string {
	if !strings.Contains(ownerHost(), "~") {
		return ""
	}
	return ownerHost()
}

// processScope digests what makes pids comparable: the boot (Linux's
// boot_id) and the pid namespace; "" where the system does not say.
func processScope() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(string(boot)) + "\x00" + ns))
	return hex.EncodeToString(sum[:6])
}

// ownerGone reports whether owner is a default owner of a process of this
// host (same boot, same pid namespace) other than this one that no longer
// exists.
func ownerGone(owner string) bool {
	local := localOwnerPrefix()
	parts := strings.Split(owner, "/")
	if local == "" || len(parts) != 3 || parts[0] != local {
		return false
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	return processGone(pid)
}
