// The node's sandbox ("pause") image: a static program that holds a Pod's namespaces, reaps
// the zombies it inherits, and exits on SIGINT or SIGTERM, like registry.k8s.io/pause. Built
// here so the node needs no registry.
module clawfleet.dev/k8s-tests/pause

go 1.26.0
