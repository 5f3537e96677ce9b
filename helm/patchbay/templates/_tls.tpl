{{- /*
The chart's TLS, computed once per render (tls.yaml writes the Secrets,
webhook.yaml puts the CA into the webhook's caBundle, the pod templates
carry the certificate's names so a re-issue restarts the pods that load it
at start). One CA signs one serving certificate holding the DNS names of
every Service the chart serves over TLS: the simulated fabric's (when
fabric.enabled and not controller.fabricInsecure) and the admission
webhook's (webhook.enabled).

Kept across upgrades with `lookup`: the CA lives in "<fullname>-tls-ca"
(never mounted), the serving pair in "<fullname>-tls", annotated with the
names it was issued for; when the wanted names change (the webhook turned
on) the serving certificate is re-issued from the same CA. A release made
by a chart without the CA Secret keeps its pair while the names stay the
fabric's; the first re-issue makes a new CA (docs/webhook.md).
*/ -}}

{{/* The Services whose names the serving certificate carries, as a list. */}}
{{- define "patchbay.tlsServices" -}}
{{- $fullname := include "patchbay.fullname" . -}}
{{- $services := list -}}
{{- if and .Values.fabric.enabled (not .Values.controller.fabricInsecure) -}}
{{- $services = append $services (printf "%s-fabric" $fullname) -}}
{{- end -}}
{{- if .Values.webhook.enabled -}}
{{- $services = append $services (printf "%s-webhook" $fullname) -}}
{{- end -}}
{{- toJson $services -}}
{{- end -}}

{{/* The DNS names of those Services, comma-separated. */}}
{{- define "patchbay.tlsNames" -}}
{{- $dns := list -}}
{{- range $svc := include "patchbay.tlsServices" . | fromJsonArray -}}
{{- $ns := $.Release.Namespace -}}
{{- $dns = concat $dns (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) -}}
{{- end -}}
{{- join "," $dns -}}
{{- end -}}

{{/* JSON {"ca": CA Secret data or {}, "serving": serving Secret data, "names": ...}; {} when the chart makes no TLS (tls.secretName, or nothing served over TLS). Memoized: every template sees the same generated keys. */}}
{{- define "patchbay.tlsData" -}}
{{- if not (hasKey .Values "__patchbayTls") -}}
{{- $out := dict -}}
{{- $names := include "patchbay.tlsNames" . -}}
{{- if and $names (not .Values.tls.secretName) -}}
{{- $fullname := include "patchbay.fullname" . -}}
{{- $name := printf "%s-tls" $fullname -}}
{{- $caOld := lookup "v1" "Secret" .Release.Namespace (printf "%s-ca" $name) -}}
{{- $old := lookup "v1" "Secret" .Release.Namespace $name -}}
{{- $oldNames := "" -}}
{{- if $old -}}
{{- $oldNames = dig "metadata" "annotations" "patchbay.dev/tls-names" "" $old -}}
{{- end -}}
{{- $fabricOnly := eq (include "patchbay.tlsServices" .) (list (printf "%s-fabric" $fullname) | toJson) -}}
{{- if and $old (or (eq $oldNames $names) (and (not $caOld) (not $oldNames) $fabricOnly)) -}}
{{- /* Kept as it is (with its CA Secret, if it has one). */ -}}
{{- $caKept := dict -}}
{{- if $caOld -}}{{- $caKept = $caOld.data -}}{{- end -}}
{{- $out = dict "serving" $old.data "names" $names "ca" $caKept -}}
{{- else -}}
{{- $ca := dict -}}
{{- $caData := dict -}}
{{- if $caOld -}}
{{- $caData = $caOld.data -}}
{{- $ca = buildCustomCert (index $caData "tls.crt") (index $caData "tls.key") -}}
{{- else -}}
{{- $ca = genCA (printf "%s-ca" $fullname) 3650 -}}
{{- $caData = dict "tls.crt" ($ca.Cert | b64enc) "tls.key" ($ca.Key | b64enc) -}}
{{- end -}}
{{- $dns := splitList "," $names -}}
{{- $cert := genSignedCert (first $dns) nil (concat (list) $dns) 3650 $ca -}}
{{- $serving := dict "ca.crt" (index $caData "tls.crt") "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) -}}
{{- $out = dict "serving" $serving "names" $names "ca" $caData -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "__patchbayTls" $out -}}
{{- end -}}
{{- get .Values "__patchbayTls" | toJson -}}
{{- end -}}

{{/* The Secret (ca.crt, tls.crt, tls.key) the webhook serves: tls.secretName, else the chart's own. */}}
{{- define "patchbay.webhookTlsSecret" -}}
{{- default (printf "%s-tls" (include "patchbay.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{/* The webhook's caBundle (base64 PEM): the chart's CA, else tls.secretName's ca.crt if that Secret exists already; else empty. */}}
{{- define "patchbay.webhookCaBundle" -}}
{{- if .Values.tls.secretName -}}
{{- $s := lookup "v1" "Secret" .Release.Namespace .Values.tls.secretName -}}
{{- if $s -}}{{- index $s.data "ca.crt" | default "" -}}{{- end -}}
{{- else -}}
{{- $tls := include "patchbay.tlsData" . | fromJson -}}
{{- dig "serving" "ca.crt" "" $tls -}}
{{- end -}}
{{- end -}}
