// Package deploy holds the checks of tokenmeter's deployment files: the
// image build (Dockerfile, .dockerignore), the Helm chart (helm/tokenmeter)
// and the compose file (compose.yaml). It is a module of its own so that
// Helm's, Kubernetes' and compose-spec's libraries stay out of the main
// module; its tests run without a container engine, a cluster or the
// network (the binaries' flags come from building ../cmd/meterd and
// ../cmd/gpu-agent).
package deploy
