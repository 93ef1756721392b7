// Command gitopscheck reads Kubernetes objects as a GitOps tool does, for the tests and docs/gitops.md:
//
//	gitopscheck kstatus [FILE]          kstatus' verdict (sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute), the
//	                                    library Flux's health checks and `kubectl wait`-style tools use
//	gitopscheck argocd SCRIPT [FILE]    an Argo CD resource.customizations health.lua, run in gopher-lua as Argo CD's
//	                                    util/lua runs a custom script: package, base, table and a safe os only, the
//	                                    object as the global `obj`, one second at most
//
// FILE (or stdin) holds one object as JSON or YAML, or a List of them; one JSON line is printed per object.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: gitopscheck kstatus [FILE] | gitopscheck argocd SCRIPT [FILE]")
	}
	var err error
	switch os.Args[1] {
	case "kstatus":
		err = each(arg(2), func(obj *unstructured.Unstructured) (any, error) {
			result, err := status.Compute(obj)
			if err != nil {
				return nil, err
			}
			return map[string]any{"name": obj.GetName(), "kind": obj.GetKind(), "status": result.Status.String(),
				"message": result.Message, "conditions": result.Conditions}, nil
		})
	case "argocd":
		if len(os.Args) < 3 {
			fail("usage: gitopscheck argocd SCRIPT [FILE]")
		}
		script, readErr := os.ReadFile(os.Args[2])
		if readErr != nil {
			fail(readErr.Error())
		}
		err = each(arg(3), func(obj *unstructured.Unstructured) (any, error) {
			health, err := runHealth(obj, string(script))
			if err != nil {
				return nil, err
			}
			health["name"], health["kind"] = obj.GetName(), obj.GetKind()
			return health, nil
		})
	default:
		fail("unknown command " + os.Args[1])
	}
	if err != nil {
		fail(err.Error())
	}
}

func arg(i int) string {
	if len(os.Args) > i {
		return os.Args[i]
	}
	return "-"
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, "gitopscheck:", message)
	os.Exit(2)
}

func each(file string, judge func(*unstructured.Unstructured) (any, error)) error {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return err
	}
	data, err = yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	// Decoded as client-go decodes what it reads from the API server (integers as int64), a List into its items.
	decoded, _, err := unstructured.UnstructuredJSONScheme.Decode(data, nil, nil)
	if err != nil {
		return err
	}
	var objects []*unstructured.Unstructured
	switch d := decoded.(type) {
	case *unstructured.UnstructuredList:
		for i := range d.Items {
			objects = append(objects, &d.Items[i])
		}
	case *unstructured.Unstructured:
		objects = append(objects, d)
	default:
		return fmt.Errorf("not an object: %T", decoded)
	}
	out := json.NewEncoder(os.Stdout)
	for _, object := range objects {
		verdict, err := judge(object)
		if err != nil {
			return err
		}
		if err := out.Encode(verdict); err != nil {
			return err
		}
	}
	return nil
}

// runHealth is Argo CD's VM.runLua + ExecuteHealthLua (util/lua/lua.go) for a custom script (useOpenLibs unset).
func runHealth(obj *unstructured.Unstructured, script string) (map[string]any, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, pair := range []struct {
		n string
		f lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(pair.f), NRet: 0, Protect: true}, lua.LString(pair.n)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decodeValue(l, obj.Object))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	returned, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("expect table output from Lua script, not %s", l.Get(-1).Type())
	}
	health := map[string]any{"status": lua.LVAsString(returned.RawGetString("status")),
		"message": lua.LVAsString(returned.RawGetString("message"))}
	switch health["status"] {
	case "Unknown", "Progressing", "Suspended", "Healthy", "Degraded", "Missing":
	default:
		health["status"], health["message"] = "Unknown", "Lua returned an invalid health status"
	}
	return health, nil
}

// openSafeOs is Argo CD's safe os library: time, date and clock only.
func openSafeOs(l *lua.LState) int {
	os := l.NewTable()
	l.SetFuncs(os, map[string]lua.LGFunction{
		"time":  func(l *lua.LState) int { l.Push(lua.LNumber(time.Now().Unix())); return 1 },
		"clock": func(l *lua.LState) int { l.Push(lua.LNumber(float64(time.Now().UnixNano()) / 1e9)); return 1 },
	})
	l.SetGlobal(lua.OsLibName, os)
	l.Push(os)
	return 1
}

// decodeValue is Argo CD's (util/lua/lua.go): JSON values to Lua values.
func decodeValue(l *lua.LState, value any) lua.LValue {
	switch converted := value.(type) {
	case bool:
		return lua.LBool(converted)
	case float64:
		return lua.LNumber(converted)
	case string:
		return lua.LString(converted)
	case json.Number:
		return lua.LString(converted)
	case int:
		return lua.LNumber(converted)
	case int32:
		return lua.LNumber(converted)
	case int64:
		return lua.LNumber(converted)
	case []any:
		arr := l.CreateTable(len(converted), 0)
		for _, item := range converted {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(converted))
		for key, item := range converted {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}
