// Validates KEDA objects with @kubernetes-models/keda (schemas generated from KEDA's API types).
// stdin: a JSON array of objects; stdout: a JSON array, per object {"ok": bool, "errors": [...]}.
import { readFileSync } from "node:fs";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { ScaledJob } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledJob";
import { TriggerAuthentication } from "@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication";

const MODELS = { ScaledObject, ScaledJob, TriggerAuthentication };

function check(object) {
  const Model = MODELS[object.kind];
  if (Model === undefined) {
    return { ok: false, errors: [`no KEDA schema for kind ${object.kind}`] };
  }
  try {
    new Model(object).validate();
    return { ok: true, errors: [] };
  } catch (error) {
    const details = (error.errors ?? []).map((e) => `${e.instancePath || "/"} ${e.message}`);
    return { ok: false, errors: details.length ? details : [String(error.message)] };
  }
}

const objects = JSON.parse(readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(objects.map(check)));
