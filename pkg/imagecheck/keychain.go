package imagecheck

import (
	"context"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	corev1 "k8s.io/api/core/v1"
)

// SecretsKeychain resolves credentials from image pull Secrets
// (kubernetes.io/dockerconfigjson or dockercfg), as the kubelet would, then
// falls back to base (nil: anonymous). credentials names what it was made
// from (names and resourceVersions), for Request.Credentials.
func SecretsKeychain(ctx context.Context, secrets []corev1.Secret, base authn.Keychain) (kc authn.Keychain, credentials string, err error) {
	fromSecrets, err := kauth.NewFromPullSecrets(ctx, secrets)
	if err != nil {
		return nil, "", err
	}
	ids := make([]string, 0, len(secrets))
	for _, s := range secrets {
		ids = append(ids, s.Namespace+"/"+s.Name+"@"+s.ResourceVersion)
	}
	sort.Strings(ids)
	if base == nil {
		return fromSecrets, strings.Join(ids, ","), nil
	}
	return authn.NewMultiKeychain(fromSecrets, base), strings.Join(append(ids, "+base"), ","), nil
}
